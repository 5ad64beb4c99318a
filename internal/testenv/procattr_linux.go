package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process get SIGKILL if the test process dies first (a
// test timeout's panic, say), so that no spawned server or child outlives a run.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
