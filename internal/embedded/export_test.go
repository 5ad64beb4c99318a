package embedded

// StartRedisOn is StartRedisServer on the ports next hands out, one a try: for the
// test of the retry on a port someone else took.
func StartRedisOn(dir string, next func() int) (*Proc, error) {
	return startProc("redis-server", dir, redisReady, func(dir string) (int, []string, error) {
		port := next()
		return port, redisArgv(port, dir, false), nil
	})
}
