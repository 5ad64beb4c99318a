package embedded

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dedupkit/dedupkit/internal/proc"
)

// StartRedisServer starts redis-server (from PATH) on a free loopback port, without
// persistence, working in dir ("" for a temp dir that Stop removes), with the extra
// arguments args (later arguments override earlier ones, as in redis.conf). It
// returns once the server logs that it accepts connections (after loading any data
// it persisted).
//
// When args name a --tls-cert-file, the port serves TLS and the plain port is off.
// The error wraps exec.ErrNotFound when redis-server is not on PATH.
func StartRedisServer(dir string, args ...string) (*Proc, error) {
	tls := slices.Contains(args, "--tls-cert-file")
	return proc.Spawn("redis-server", dir, proc.RedisReady, func(dir string) (int, []string, error) {
		port, err := proc.FreePort()
		if err != nil {
			return 0, nil, err
		}
		return port, append(proc.RedisArgv(port, dir, tls), args...), nil
	})
}

// StartRedisSentinel starts a redis-server in sentinel mode on a free loopback port,
// monitoring the primary at primaryAddr under masterName with the given quorum, and
// deciding a primary is down after downAfter. dir is as for StartRedisServer; the
// sentinel's config file, sentinel.conf, is written there.
func StartRedisSentinel(dir, masterName, primaryAddr string, quorum int, downAfter time.Duration) (*Proc, error) {
	host, port, err := net.SplitHostPort(primaryAddr)
	if err != nil {
		return nil, err
	}
	return proc.Spawn("redis-server", dir, proc.RedisReady, func(dir string) (int, []string, error) {
		p, err := proc.FreePort()
		if err != nil {
			return 0, nil, err
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\n"+
			"sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\n",
			p, masterName, host, port, quorum, masterName, downAfter.Milliseconds(), masterName)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return 0, nil, err
		}
		return p, []string{conf, "--sentinel", "--dir", dir}, nil
	})
}
