package procs

import "syscall"

// sysProcAttr puts a process in its own group, so that a kill reaches its children, and has it
// die with the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
