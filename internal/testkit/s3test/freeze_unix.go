//go:build unix

package s3test

import "syscall"

// Freeze stops the server without closing its socket (SIGSTOP): requests hang instead of being
// refused, like a storage service that stopped answering. Thaw lets it go on.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw undoes Freeze.
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }
