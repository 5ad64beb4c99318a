package dedup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithDirectConnections sends the store's commands (auto-pipelined single calls and
// the batch calls) on connections of the store's own, with a small RESP2 codec of its
// own, instead of through go-redis's command processing. The connections are dialed
// and set up from the client's Options: its Dialer (so TLS), Username and Password or
// credentials provider, DB, ClientName, timeouts (ReadTimeout, WriteTimeout,
// ContextTimeoutEnabled), retries (MaxRetries, MinRetryBackoff, MaxRetryBackoff) and
// PoolSize, which bounds how many are open. A round trip that fails on the network,
// or is answered LOADING, READONLY, MASTERDOWN, TRYAGAIN or CLUSTERDOWN, is sent again
// on a new connection, as go-redis does: the owner tokens make a retried write that
// had landed the caller's own.
//
// What it costs: go-redis hooks (redisotel tracing and metrics, AddHook) do not see
// these commands; dedup's own metrics (WithMeterProvider) still do. The client must
// be a *redis.Client (a failover client is one); a cluster or ring is an error, as
// are the client options the codec cannot honour (OnConnect,
// StreamingCredentialsProvider, Limiter). The store holds the connections until its
// Close. WithWaitReplicas writes keep using the client.
//
// It cuts the client's CPU per command: at 64 concurrent Marks on this project's
// 2-core test machine it ran 1.5–1.7× the rate of go-redis's pipelines (see the
// README's Performance section).
func WithDirectConnections() RedisOption {
	return func(s *RedisStore) error {
		c, ok := s.c.(*redis.Client)
		if !ok {
			return fmt.Errorf("%w: direct connections need a *redis.Client, not a %T", ErrInvalidOption, s.c)
		}
		opt := c.Options()
		switch {
		case opt.OnConnect != nil:
			return fmt.Errorf("%w: direct connections cannot run the client's OnConnect", ErrInvalidOption)
		case opt.StreamingCredentialsProvider != nil:
			return fmt.Errorf("%w: direct connections cannot re-authenticate with a StreamingCredentialsProvider", ErrInvalidOption)
		case opt.Limiter != nil:
			return fmt.Errorf("%w: direct connections do not go through the client's Limiter", ErrInvalidOption)
		}
		s.direct = newDirectConns(opt)
		return nil
	}
}

// ErrStoreClosed is the error of a call on a RedisStore after its Close.
var ErrStoreClosed = errors.New("dedup: redis store closed")

// Close closes the store's direct connections (WithDirectConnections); calls made
// after it fail with ErrStoreClosed. Without direct connections it does nothing: the
// store holds nothing of its own, and the client is the caller's to close.
func (s *RedisStore) Close() error {
	if s.direct != nil {
		s.direct.close()
	}
	return nil
}

// directConns is the store's own connections: at most opt.PoolSize open, the idle
// ones kept for reuse.
type directConns struct {
	opt   *redis.Options
	slots chan struct{}    // one per open connection
	idle  chan *directConn // as many places as slots: a put never blocks

	mu     sync.Mutex // orders put and close
	closed bool
}

type directConn struct {
	nc     net.Conn
	r      *bufio.Reader
	w      []byte
	usedAt time.Time
}

func newDirectConns(opt *redis.Options) *directConns {
	n := max(opt.PoolSize, 1)
	return &directConns{opt: opt, slots: make(chan struct{}, n), idle: make(chan *directConn, n)}
}

// cleanUpDirect closes the direct connections of a store that was dropped unclosed.
func cleanUpDirect(s *RedisStore) {
	if s.direct != nil {
		runtime.AddCleanup(s, func(d *directConns) { d.close() }, s.direct)
	}
}

func (d *directConns) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for {
		select {
		case c := <-d.idle:
			d.drop(c)
		default:
			return
		}
	}
}

// drop closes c and frees its slot.
func (d *directConns) drop(c *directConn) {
	_ = c.nc.Close()
	<-d.slots
}

// get returns an idle connection, or dials one while fewer than PoolSize are open;
// otherwise it waits for either.
func (d *directConns) get(ctx context.Context) (*directConn, error) {
	for {
		var c *directConn
		select {
		case c = <-d.idle:
		default:
			select {
			case c = <-d.idle:
			case d.slots <- struct{}{}:
				d.mu.Lock()
				closed := d.closed
				d.mu.Unlock()
				if closed {
					<-d.slots
					return nil, ErrStoreClosed
				}
				c, err := d.dial(ctx)
				if err != nil {
					<-d.slots
					return nil, err
				}
				return c, nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		if d.opt.ConnMaxIdleTime <= 0 || time.Since(c.usedAt) < d.opt.ConnMaxIdleTime {
			return c, nil
		}
		d.drop(c) // idle too long: the server or a proxy may have dropped it
	}
}

// put gives c back; a broken one (or any, once closed) is closed instead.
func (d *directConns) put(c *directConn, broken bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if broken || d.closed {
		d.drop(c)
		return
	}
	c.usedAt = time.Now()
	d.idle <- c
}

// dial opens a connection with the client's Dialer and sets it up as go-redis would:
// AUTH, SELECT, CLIENT SETNAME, in one round trip.
func (d *directConns) dial(ctx context.Context) (*directConn, error) {
	opt := d.opt
	dctx, cancel := context.WithTimeout(ctx, max(opt.DialTimeout, time.Second))
	defer cancel()
	nc, err := opt.Dialer(dctx, opt.Network, opt.Addr)
	if err != nil {
		return nil, err
	}
	c := &directConn{nc: nc, r: bufio.NewReaderSize(nc, 16<<10)}
	user, pass := opt.Username, opt.Password
	switch {
	case opt.CredentialsProviderContext != nil:
		if user, pass, err = opt.CredentialsProviderContext(dctx); err != nil {
			_ = nc.Close()
			return nil, err
		}
	case opt.CredentialsProvider != nil:
		user, pass = opt.CredentialsProvider()
	}
	var setup []redis.Cmder
	switch {
	case pass != "" && user != "":
		setup = append(setup, redis.NewStatusCmd(ctx, "auth", user, pass))
	case pass != "":
		setup = append(setup, redis.NewStatusCmd(ctx, "auth", pass))
	}
	if opt.DB != 0 {
		setup = append(setup, redis.NewStatusCmd(ctx, "select", opt.DB))
	}
	if opt.ClientName != "" {
		setup = append(setup, redis.NewStatusCmd(ctx, "client", "setname", opt.ClientName))
	}
	if len(setup) > 0 {
		again, err := d.exchange(dctx, c, setup)
		if err == nil && len(again) > 0 {
			err = again[0].Err()
		}
		for _, cmd := range setup {
			if err == nil {
				err = cmd.Err()
			}
		}
		if err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("dedup: direct connection set-up: %w", err)
		}
	}
	return c, nil
}

// roundTrip sends cmds in one round trip and gives each its reply. It returns an
// error only when the round trip failed as a whole (the commands then hold it too);
// error replies stay on their commands. A failure on the network, and the replies a
// failover or a loading server gives, are retried on a new connection up to
// MaxRetries times: the commands still without a reply are sent again.
func (d *directConns) roundTrip(ctx context.Context, cmds []redis.Cmder) error {
	pending := cmds
	var err error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if werr := sleepCtx(ctx, d.backoff(attempt)); werr != nil {
				err = werr
				break
			}
		}
		var c *directConn
		if c, err = d.get(ctx); err != nil {
			if !retryable(err) || attempt >= d.opt.MaxRetries {
				break
			}
			continue
		}
		var again []redis.Cmder
		again, err = d.exchange(ctx, c, pending)
		d.put(c, err != nil || len(again) > 0)
		if err == nil && len(again) == 0 {
			return nil
		}
		pending = again
		if (err != nil && !retryable(err)) || attempt >= d.opt.MaxRetries {
			break
		}
	}
	if err == nil { // retries spent on retryable replies: they are the answers
		return nil
	}
	for _, cmd := range pending {
		cmd.SetErr(err)
	}
	return err
}

// exchange writes cmds on c and reads their replies. again is what to send again:
// on a stream error (err), the commands still without a reply; otherwise those
// answered with a retryable error (their replies are set all the same, should the
// retries run out).
func (d *directConns) exchange(ctx context.Context, c *directConn, cmds []redis.Cmder) (again []redis.Cmder, err error) {
	w := c.w[:0]
	for _, cmd := range cmds {
		if w, err = appendCommand(w, cmd.Args()); err != nil {
			c.w = w[:0]
			return cmds, err
		}
	}
	c.w = w
	if dl, ok := d.deadline(ctx, d.opt.WriteTimeout); ok {
		_ = c.nc.SetWriteDeadline(dl)
	}
	if _, err := c.nc.Write(w); err != nil {
		return cmds, err
	}
	if cap(c.w) > 64<<10 { // do not keep a big batch's buffer for ever
		c.w = nil
	}
	if dl, ok := d.deadline(ctx, d.opt.ReadTimeout); ok {
		_ = c.nc.SetReadDeadline(dl)
	}
	for i, cmd := range cmds {
		v, err := readReply(c.r)
		if err != nil {
			return cmds[i:], err
		}
		if err := setReply(cmd, v); err != nil {
			return cmds[i:], err // a reply this codec cannot give the command: drop it
		}
		if e, ok := v.(replyError); ok && retryableReply(string(e)) {
			again = append(again, cmd)
		}
	}
	return again, nil
}

// deadline is when an I/O with timeout must end, as go-redis sets it: none for 0, no
// deadline call at all for -1, the context's if earlier and ContextTimeoutEnabled.
func (d *directConns) deadline(ctx context.Context, timeout time.Duration) (time.Time, bool) {
	if timeout < 0 {
		return time.Time{}, false
	}
	var dl time.Time
	if timeout > 0 {
		dl = time.Now().Add(timeout)
	}
	if d.opt.ContextTimeoutEnabled {
		if cd, ok := ctx.Deadline(); ok && (dl.IsZero() || cd.Before(dl)) {
			dl = cd
		}
	}
	return dl, true
}

// backoff is go-redis's: exponential from MinRetryBackoff, capped at
// MaxRetryBackoff, with jitter.
func (d *directConns) backoff(attempt int) time.Duration {
	lo, hi := d.opt.MinRetryBackoff, d.opt.MaxRetryBackoff
	if lo <= 0 {
		return 0
	}
	b := lo << min(attempt, 30)
	if b <= 0 || (hi > 0 && b > hi) {
		b = hi
	}
	return b/2 + rand.N(b/2+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// retryable tells the failures worth a new connection: the network's, not the
// context's, a closed store's, nor a codec's.
func retryable(err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, ErrStoreClosed), errors.Is(err, errProtocol):
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// retryableReply tells the error replies that a new connection, later, may not get:
// a server loading its data, a replica after a failover, a cluster in transition.
func retryableReply(msg string) bool {
	for _, p := range []string{"LOADING ", "READONLY ", "MASTERDOWN ", "TRYAGAIN ", "CLUSTERDOWN "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
