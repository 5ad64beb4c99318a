//go:build unix

package embedded

import "syscall"

// The signals of Proc.Pause and Proc.Resume.
var sigStop, sigCont = syscall.SIGSTOP, syscall.SIGCONT
