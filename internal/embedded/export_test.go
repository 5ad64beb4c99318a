package embedded

import "github.com/dedupkit/dedupkit/internal/proc"

// StartRedisOn is StartRedisServer on the ports next hands out, one a try: for the
// test of the retry on a port someone else took.
func StartRedisOn(dir string, next func() int) (*Proc, error) {
	return proc.Spawn("redis-server", dir, proc.RedisReady, func(dir string) (int, []string, error) {
		port := next()
		return port, proc.RedisArgv(port, dir, false), nil
	})
}
