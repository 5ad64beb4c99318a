//go:build !linux

package proc

import "os/exec"

// DieWithParent does nothing here: only Linux has a parent-death signal. A process
// outlives its owner only when the owner dies without killing it.
func DieWithParent(*exec.Cmd) {}
