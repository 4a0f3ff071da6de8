//go:build !unix && !windows

package osdep

import (
	"errors"
	"os"
	"time"
)

// CPU reports unknown on this system.
func CPU() (time.Duration, bool) { return 0, false }

// MaxRSS reports unknown on this system.
func MaxRSS() (int64, bool) { return 0, false }

// FileLimit reports unknown on this system.
func FileLimit() (int, bool) { return 0, false }

// LockFile reports that this system has no file locks here.
func LockFile(f *os.File) error { return errors.ErrUnsupported }

// SetsockoptInt reports that this system has no socket options here.
func SetsockoptInt(fd uintptr, level, opt, value int) error { return errors.ErrUnsupported }
