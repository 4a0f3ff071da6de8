//go:build unix && !linux

package procs

import "syscall"

// sysProcAttr puts a process in its own group, so that a kill reaches its children. Only Linux
// also kills it when the test binary dies (Pdeathsig).
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
