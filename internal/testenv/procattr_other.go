//go:build !linux

package testenv

import "os/exec"

// DieWithParent is a no-op where the system cannot tie a child's life to its parent's.
func DieWithParent(*exec.Cmd) {}
