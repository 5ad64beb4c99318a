//go:build unix

package dedup

import (
	"errors"
	"net"
	"syscall"
)

// connAlive peeks at an idle connection's socket without blocking: a connection the
// server has closed reads EOF, and one with bytes waiting is out of step. Either is
// dropped rather than used. Connections with no socket of their own (TLS) pass.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = n <= 0 && (errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK))
		return true // never wait for the socket
	})
	return err == nil && alive
}
