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
// 2-core test machine it ran 1.08–1.34× the rate of the default (go-redis
// pipelines), and JetStream handlers 0.82–1.18×, where the client is not the limit
// (the rounds of the README's Performance run).
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

// Close closes the store's direct connections (WithDirectConnections), those in use
// too: the calls that need them fail with ErrStoreClosed from then on (WithWaitReplicas
// writes, which go through the client, do not). Without direct connections it does
// nothing: the store holds nothing of its own, and the client is the caller's to
// close.
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

	mu     sync.Mutex // orders put and close, and guards open
	closed bool
	open   map[*directConn]struct{} // idle and in use: Close closes them all
}

type directConn struct {
	nc        net.Conn
	r         *bufio.Reader
	w         []byte
	createdAt time.Time
	usedAt    time.Time
}

func newDirectConns(opt *redis.Options) *directConns {
	n := max(opt.PoolSize, 1)
	return &directConns{opt: opt, slots: make(chan struct{}, n), idle: make(chan *directConn, n),
		open: make(map[*directConn]struct{}, n)}
}

// cleanUpDirect closes the direct connections of a store that was dropped unclosed.
func cleanUpDirect(s *RedisStore) {
	if s.direct != nil {
		runtime.AddCleanup(s, func(d *directConns) { d.close() }, s.direct)
	}
}

// close closes every connection: the idle ones, and those in use, whose calls then
// fail (and are not retried: the store is closed).
func (d *directConns) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for {
		select {
		case c := <-d.idle:
			d.dropLocked(c)
		default:
			for c := range d.open { // in use: put drops them
				_ = c.nc.Close()
			}
			return
		}
	}
}

// drop closes c and frees its slot.
func (d *directConns) drop(c *directConn) {
	d.mu.Lock()
	d.dropLocked(c)
	d.mu.Unlock()
}

func (d *directConns) dropLocked(c *directConn) {
	if _, ok := d.open[c]; !ok {
		return // closed by close already, and its slot freed
	}
	delete(d.open, c)
	_ = c.nc.Close()
	<-d.slots
}

// get returns an idle connection, or dials one while fewer than PoolSize are open;
// otherwise it waits for either, up to the client's PoolTimeout.
func (d *directConns) get(ctx context.Context) (*directConn, error) {
	var timeout <-chan time.Time
	for {
		var c *directConn
		select {
		case c = <-d.idle:
		default:
			if timeout == nil && d.opt.PoolTimeout > 0 {
				t := time.NewTimer(d.opt.PoolTimeout)
				defer t.Stop()
				timeout = t.C
			}
			select {
			case c = <-d.idle:
			case d.slots <- struct{}{}:
				return d.dialInSlot(ctx)
			case <-timeout:
				return nil, redis.ErrPoolTimeout
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		if d.usable(c) {
			return c, nil
		}
		d.drop(c)
	}
}

// usable tells whether an idle connection may be used: not past the client's
// ConnMaxIdleTime or ConnMaxLifetime, and, after a second idle, not closed by the
// server meanwhile (an idle timeout, a restart), as go-redis checks its own.
func (d *directConns) usable(c *directConn) bool {
	now := time.Now()
	idle := now.Sub(c.usedAt)
	switch {
	case d.opt.ConnMaxIdleTime > 0 && idle >= d.opt.ConnMaxIdleTime,
		d.opt.ConnMaxLifetime > 0 && now.Sub(c.createdAt) >= d.opt.ConnMaxLifetime:
		return false
	case idle >= time.Second:
		return connAlive(c.nc)
	}
	return true
}

// dialInSlot dials a connection in the slot the caller has taken.
func (d *directConns) dialInSlot(ctx context.Context) (*directConn, error) {
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
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed { // closed while dialing
		_ = c.nc.Close()
		<-d.slots
		return nil, ErrStoreClosed
	}
	d.open[c] = struct{}{}
	return c, nil
}

// put gives c back; a broken one (or any, once closed) is closed instead.
func (d *directConns) put(c *directConn, broken bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if broken || d.closed {
		d.dropLocked(c)
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
	c := &directConn{nc: nc, r: bufio.NewReaderSize(nc, 16<<10), createdAt: time.Now()}
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
		_, err := d.exchange(dctx, c, setup) // a stream error, else the first error reply
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
			// a connection that could not be had (a dial timeout, a server at its
			// client limit) is worth another try, unless the call or the store is over
			if ctx.Err() != nil || errors.Is(err, ErrStoreClosed) || attempt >= d.opt.MaxRetries {
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
			return append(again, cmds[i:]...), err
		}
		if err := setReply(cmd, v); err != nil {
			return append(again, cmds[i:]...), err // a reply this codec cannot give the command
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
	if lo <= 0 || hi <= 0 {
		return 0
	}
	b := lo << min(attempt, 30)
	if b <= 0 || b > hi {
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
// a server loading its data, a replica after a failover, a cluster in transition, a
// server at its client limit (it says so and closes the connection).
func retryableReply(msg string) bool {
	for _, p := range []string{"LOADING ", "READONLY ", "MASTERDOWN ", "TRYAGAIN ", "CLUSTERDOWN ", "NOREPLICAS ",
		"ERR max number of clients reached"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
