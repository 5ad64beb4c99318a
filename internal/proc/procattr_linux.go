package proc

import (
	"os/exec"
	"syscall"
)

// DieWithParent has the kernel kill cmd's process (SIGKILL) should this process die
// first (a test binary that times out, a SIGKILL), so that no spawned server or
// child process outlives its owner.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
