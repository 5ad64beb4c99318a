//go:build !linux

package embedded

import "os/exec"

// dieWithParent does nothing here: only Linux has a parent-death signal. A server
// outlives its owner only when the owner dies without calling Stop.
func dieWithParent(*exec.Cmd) {}
