package chatlink

import (
	"runtime"
	"sync"
	"time"

	"roomcast/internal/osdep"
)

// cpuMeter measures the process's CPU use between two readings, as a share of all cores.
type cpuMeter struct {
	mu      sync.Mutex // guards the fields below
	lastAt  time.Time
	lastCPU time.Duration
	share   float64
}

// usage returns the CPU share since the previous call (0 on the first).
func (m *cpuMeter) usage() float64 {
	cpu, ok := osdep.CPU()
	if !ok {
		return 0
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.lastAt.IsZero() && now.After(m.lastAt) {
		m.share = float64(cpu-m.lastCPU) / float64(now.Sub(m.lastAt)) / float64(runtime.NumCPU())
	}
	m.lastAt, m.lastCPU = now, cpu
	return m.share
}
