package testkit

import (
	"time"

	"roomcast/internal/osdep"
)

// ProcessCPU returns the CPU time (user and system) the process has used, for benchmarks that
// report CPU per operation rather than wall time.
func ProcessCPU() time.Duration {
	cpu, _ := osdep.CPU()
	return cpu
}
