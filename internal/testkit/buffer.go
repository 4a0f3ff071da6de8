package testkit

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for a writer and a reader in different goroutines: a role's
// logs that a test reads while the role writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
