package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill a consumer process should the soak die without
// stopping it (a SIGKILL, a test binary that times out), so that none outlives it.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
