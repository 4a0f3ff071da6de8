//go:build unix

package osdep

import (
	"errors"
	"os"
	"runtime"
	"syscall"
	"time"
)

// CPU returns the CPU time (user and system) the process has used, and false when the system
// would not say.
func CPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// MaxRSS returns the process's peak resident memory in bytes, and false when the system
// would not say.
func MaxRSS() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return int64(ru.Maxrss), true // bytes there
	}
	return int64(ru.Maxrss) * 1024, true // kilobytes on Linux and the BSDs
}

// FileLimit returns the process's soft limit on open files, and false when the system would
// not say or sets none worth the name.
func FileLimit() (int, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0, false
	}
	return int(rl.Cur), true
}

// LockFile takes an exclusive lock on f without waiting, held until f is closed or the
// process ends, however it ends. It returns ErrLocked when another holds it.
func LockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return ErrLocked
	}
	return err
}

// SetsockoptInt sets an integer socket option on the descriptor fd (what a
// syscall.RawConn's Control hands over).
func SetsockoptInt(fd uintptr, level, opt, value int) error {
	return syscall.SetsockoptInt(int(fd), level, opt, value)
}
