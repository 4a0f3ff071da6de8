package s3test

import (
	"os/exec"
	"syscall"
)

// dieWithParent has cmd die with the test binary, whatever happens to it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
