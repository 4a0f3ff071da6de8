package testkit

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user and system) the process has used, for benchmarks that
// report CPU per operation rather than wall time.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
