//go:build !unix

package testenv

import (
	"net"
	"testing"
)

// RefusedAddr returns a loopback address where nothing listens: that of a listener
// just closed. Unlike on unix, where the port stays bound for the test, another
// process may take it meanwhile.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
