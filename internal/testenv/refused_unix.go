//go:build unix

package testenv

import (
	"fmt"
	"net"
	"syscall"
	"testing"
)

// RefusedAddr returns a loopback address where a connection is refused for the rest
// of the test: a TCP socket is bound there without listening, so the kernel answers
// every connection with a reset and no other process (a server another test spawns
// on a free port, say) can take the port meanwhile, as it could after a listener was
// merely closed.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	// As the net package does where SOCK_CLOEXEC is missing (darwin): no child
	// forked between socket and CloseOnExec inherits it.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("getsockname: %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(in.Port))
}
