package osdep

import (
	"errors"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/windows"
)

// CPU returns the CPU time (user and kernel) the process has used, and false when the system
// would not say.
func CPU() (time.Duration, bool) {
	h, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0, false
	}
	var creation, exit, kernel, user syscall.Filetime
	if err := syscall.GetProcessTimes(h, &creation, &exit, &kernel, &user); err != nil {
		return 0, false
	}
	// A FILETIME that counts a duration is in 100-nanosecond intervals.
	ticks := func(f syscall.Filetime) int64 { return int64(f.HighDateTime)<<32 | int64(f.LowDateTime) }
	return time.Duration(ticks(kernel)+ticks(user)) * 100, true
}

// MaxRSS reports unknown on Windows: its peak working set is not read here.
func MaxRSS() (int64, bool) { return 0, false }

// FileLimit reports unknown on Windows, which has no limit on open files of this kind.
func FileLimit() (int, bool) { return 0, false }

// LockFile takes an exclusive lock on f without waiting, held until f is closed or the
// process ends, however it ends. It returns ErrLocked when another holds it.
func LockFile(f *os.File) error {
	var ol windows.Overlapped
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return ErrLocked
	}
	return err
}

// SetsockoptInt sets an integer socket option on the socket handle fd (what a
// syscall.RawConn's Control hands over).
func SetsockoptInt(fd uintptr, level, opt, value int) error {
	return syscall.SetsockoptInt(syscall.Handle(fd), level, opt, value)
}
