//go:build !linux

package loadgen

import "errors"

var errNoAffinity = errors.New("CPU affinity is only set and read on Linux")

func pinProcess(int, CPUList) error { return errNoAffinity }

func processCPUs(int) (CPUList, error) { return nil, errNoAffinity }
