//go:build !unix

package proc

import "os"

// No SIGSTOP here: Proc.Pause and Proc.Resume return errors.ErrUnsupported.
var sigStop, sigCont os.Signal
