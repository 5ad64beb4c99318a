package proc

import (
	"fmt"
	"strconv"
	"strings"
)

// RedisArgv is the command line of a redis-server on port (TLS only when tls) on
// loopback, working in dir, without persistence.
func RedisArgv(port int, dir string, tls bool) []string {
	argv := []string{"--port", strconv.Itoa(port)}
	if tls {
		argv = []string{"--port", "0", "--tls-port", strconv.Itoa(port)}
	}
	return append(argv, "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no")
}

// RedisReady is Spawn's ready for a redis-server: it reports whether the log since
// the start says the server accepts connections ("Ready to accept connections",
// logged once the data is loaded and the ports are open, or for a sentinel its ID,
// logged once listening). The log serves where a PING cannot: on a TLS-only port.
func RedisReady(_ *Proc, log string) error {
	if strings.Contains(log, "Ready to accept connections") || strings.Contains(log, "Sentinel ID is") {
		return nil
	}
	return fmt.Errorf("no %q in its log yet", "Ready to accept connections")
}
