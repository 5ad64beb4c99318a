//go:build !linux

package main

import "os/exec"

// dieWithParent does nothing here: only Linux has a parent-death signal. A consumer
// outlives the soak only when the soak dies without stopping it.
func dieWithParent(*exec.Cmd) {}
