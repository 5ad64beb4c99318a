package testenv

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m, nil) }

func TestFrameLenMeasuresWholeRESPFrames(t *testing.T) {
	cases := []struct {
		in   string
		n    int
		ok   bool
		fail bool
	}{
		{"+OK\r\n", 5, true, false},
		{"+OK\r", 0, false, false},
		{"$3\r\nfoo\r\n+OK\r\n", 9, true, false},
		{"$3\r\nfo", 0, false, false},
		{"$-1\r\n", 5, true, false},
		{"_\r\n", 3, true, false},
		{"*2\r\n:1\r\n:250\r\n", 14, true, false},
		{"*2\r\n:1\r\n", 0, false, false},
		{"*-1\r\n", 5, true, false},
		{"%1\r\n+a\r\n*1\r\n$1\r\nb\r\n", 19, true, false},
		{"|1\r\n+k\r\n+v\r\n:7\r\n", 16, true, false},
		{">2\r\n+m\r\n+x\r\n", 12, true, false},
		{"=7\r\ntxt:abc\r\n", 13, true, false},
		{"?\r\n", 0, false, true},
		{"$x\r\n", 0, false, true},
	}
	for _, c := range cases {
		n, ok, err := FrameLen([]byte(c.in))
		if n != c.n || ok != c.ok || (err != nil) != c.fail {
			t.Errorf("FrameLen(%q) = %d, %v, %v; want %d, %v, fail=%v", c.in, n, ok, err, c.n, c.ok, c.fail)
		}
	}
	if got := CommandName([]byte("*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n")); got != "incr" {
		t.Errorf("CommandName = %q", got)
	}
}

// Each fault is seen through INCR: a reply that was lost after the command ran shows
// as a retry that increments again.
func TestEachProxyFaultShowsThroughINCR(t *testing.T) {
	m := miniredis.RunT(t)
	p, err := NewProxy(m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const readTimeout = 50 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: readTimeout, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	defer c.Close()
	ctx := context.Background()
	incr := func() int64 {
		t.Helper()
		n, err := c.Incr(ctx, "k").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if incr() != 1 || p.Hits() != 0 {
		t.Fatal("pass-through")
	}
	steps := []struct {
		name string
		f    Fault
		want int64 // the counter after the step's INCR
	}{
		{"swallow past the read timeout", Fault{Kind: Swallow, Hold: 4 * readTimeout}, 3},
		{"swallow then drop before the timeout", Fault{Kind: Swallow, Hold: readTimeout / 5}, 5},
		{"short delay", Fault{Kind: Delay, Hold: readTimeout / 5}, 6},
		{"delay past the read timeout", Fault{Kind: Delay, Hold: 3 * readTimeout}, 8},
		{"two replies swallowed", Fault{Kind: Swallow, Replies: 2, Hold: readTimeout / 5}, 11},
	}
	for _, s := range steps {
		var calls atomic.Int32
		s.f.OnHit = func(int) { calls.Add(1) }
		p.Arm(s.f)
		got := incr()
		want := max(s.f.Replies, 1)
		if n := p.Disarm(); got != s.want || n != want || int(calls.Load()) != want {
			t.Errorf("%s: counter %d, want %d; %d replies hit, OnHit called %d times, want %d", s.name, got, s.want, n, calls.Load(), want)
		}
	}
	if got := incr(); got != 12 {
		t.Errorf("after disarm: counter %d, want 12", got)
	}
}
