//go:build unix

package proc

import "syscall"

// The signals of Proc.Pause and Proc.Resume.
var sigStop, sigCont = syscall.SIGSTOP, syscall.SIGCONT
