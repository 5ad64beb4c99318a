//go:build unix

package testenv

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// RefusedAddr's port refuses connections and cannot be taken by a listener while
// the test runs.
func TestRefusedAddrRefusesAndCannotBeTaken(t *testing.T) {
	addr := RefusedAddr(t)
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("dial %s: connected", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", addr, err)
		}
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("listen on %s succeeded while the port is held", addr)
	}
}
