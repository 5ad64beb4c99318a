// Package dedupkittest starts the servers dedupkit needs, for trying it and for
// tests: an in-process NATS server with JetStream, an embedded Redis (miniredis) whose
// keys expire on the wall clock, and a Redis Cluster of redis-server processes. It is
// not for production.
//
//	srv, err := dedupkittest.StartServers(os.Getenv("NATS_URL"), os.Getenv("REDIS_ADDR"))
//	if err != nil { ... }
//	defer srv.Close()
//	nc, err := nats.Connect(srv.NATSURL)
//	rdb := redis.NewClient(&redis.Options{Addr: srv.RedisAddr})
package dedupkittest

import "fmt"

// Servers is a NATS server and a Redis to run on: the ones given to StartServers,
// or embedded ones started for it.
type Servers struct {
	NATSURL   string // a NATS client URL
	RedisAddr string // a Redis address, host:port

	nats  *NATS  // nil when NATSURL was given
	redis *Redis // nil when RedisAddr was given
}

// StartServers returns natsURL and redisAddr, starting an in-process NATS server
// (StartNATS) when natsURL is "" and an embedded Redis (StartRedis) when redisAddr
// is "". Close stops what it started.
func StartServers(natsURL, redisAddr string) (*Servers, error) {
	s := &Servers{NATSURL: natsURL, RedisAddr: redisAddr}
	var err error
	if natsURL == "" {
		if s.nats, err = StartNATS(""); err != nil {
			return nil, err
		}
		s.NATSURL = s.nats.URL()
	}
	if redisAddr == "" {
		if s.redis, err = StartRedis(); err != nil {
			s.Close()
			return nil, err
		}
		s.RedisAddr = s.redis.Addr()
	}
	return s, nil
}

// String names the servers and says which are embedded, for a program's output.
func (s *Servers) String() string {
	kind := func(embedded bool, what string) string {
		if embedded {
			return " (" + what + ")"
		}
		return ""
	}
	return fmt.Sprintf("nats %s%s, redis %s%s", s.NATSURL, kind(s.nats != nil, "in-process"),
		s.RedisAddr, kind(s.redis != nil, "embedded miniredis"))
}

// Close stops the servers StartServers started, and may be called again.
func (s *Servers) Close() {
	if s.redis != nil {
		s.redis.Close()
	}
	if s.nats != nil {
		s.nats.Close()
	}
}
