//go:build !linux

package s3test

import "os/exec"

// dieWithParent does nothing: only Linux kills a child when its parent dies (Pdeathsig).
func dieWithParent(*exec.Cmd) {}
