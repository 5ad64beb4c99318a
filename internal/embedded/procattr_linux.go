package embedded

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server should this process die without
// stopping it (a test binary that times out, a SIGKILL), so that no spawned
// redis-server outlives its owner.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
