package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// FaultKind is what a Proxy does to a reply it faults.
type FaultKind uint8

const (
	// Delay holds the reply for Fault.Hold, then forwards it (if the client is still
	// connected; go-redis drops a connection whose read timed out).
	Delay FaultKind = iota + 1
	// Swallow drops the reply: the command ran on the server, its reply never reaches
	// the client. The connection forwards no more replies, and Fault.Hold later the
	// proxy closes both of its sides.
	Swallow
)

// Fault is what a Proxy does to the next replies once armed.
type Fault struct {
	Kind FaultKind
	// Replies is how many replies the fault hits (at least 1), across connections: a
	// retry on a new connection meets the fault again while any are left.
	Replies int
	// Hold is how long a Delay holds each reply, or how long a Swallow keeps the
	// connection open, silent, before it drops it.
	Hold time.Duration
	// OnHit, if set, is called each time a reply is hit (n counts from 1), after the
	// command has run on the server. It runs on the proxy's goroutine: do not block.
	OnHit func(n int)
}

// Proxy is a loopback TCP proxy in front of a Redis server whose replies a test can
// delay or drop, mid-command: the command reaches the server and runs, the reply is
// late or never comes. It reads the RESP protocol only to pair each reply with its
// command, so that go-redis's connection handshake (HELLO, CLIENT, AUTH, SELECT) is
// never faulted, and server push messages are never counted as replies. It is in
// pass-through mode until Arm. Safe for concurrent use.
type Proxy struct {
	upstream string
	ln       net.Listener
	done     chan struct{}
	wg       sync.WaitGroup
	hits     atomic.Int64

	mu    sync.Mutex
	conns map[*proxyConn]struct{}
	fault *Fault
	left  int // replies the armed fault has yet to hit
	n     int // replies the armed fault has hit
}

// NewProxy listens on a free loopback port and forwards every connection to upstream
// (host:port). Close it when done.
func NewProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{upstream: upstream, ln: ln, done: make(chan struct{}), conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Arm makes the next f.Replies command replies suffer f, replacing any fault still
// armed. A Replies below 1 counts as 1.
func (p *Proxy) Arm(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault, p.left, p.n = &f, max(f.Replies, 1), 0
}

// Disarm ends the armed fault (replies already held or swallowed stay so) and returns
// how many replies it hit.
func (p *Proxy) Disarm() (hit int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hit = p.n
	p.fault, p.left, p.n = nil, 0, 0
	return hit
}

// Hits returns how many replies have been faulted since the proxy started.
func (p *Proxy) Hits() int64 { return p.hits.Load() }

// Close stops the proxy: it closes the listener and every connection, and waits for
// its goroutines.
func (p *Proxy) Close() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	close(p.done)
	err := p.ln.Close()
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
	return err
}

// take returns the fault for one reply, if one is armed and has replies left.
func (p *Proxy) take() (Fault, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == nil || p.left == 0 {
		return Fault{}, 0, false
	}
	p.left--
	p.n++
	p.hits.Add(1)
	return *p.fault, p.n, true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{p: p, client: client, server: server}
		p.mu.Lock()
		select {
		case <-p.done: // Close has taken its list of connections already
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		default:
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go c.requests()
		go c.replies()
	}
}

// proxyConn is one client connection and its server connection.
type proxyConn struct {
	p              *Proxy
	client, server net.Conn
	once           sync.Once

	mu      sync.Mutex
	pending []string // names of the commands sent and not yet answered, in order
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// requests forwards the client's bytes, noting each command's name before the server
// can answer it.
func (c *proxyConn) requests() {
	defer c.p.wg.Done()
	defer c.close()
	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(chunk)
		if n > 0 {
			buf = append(buf, chunk[:n]...)
			for {
				size, ok, ferr := FrameLen(buf)
				if ferr != nil {
					return
				}
				if !ok {
					break
				}
				c.mu.Lock()
				c.pending = append(c.pending, CommandName(buf[:size]))
				c.mu.Unlock()
				buf = buf[size:]
			}
			if _, werr := c.server.Write(chunk[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// replies forwards the server's replies, applying the armed fault to replies of
// commands other than the handshake.
func (c *proxyConn) replies() {
	defer c.p.wg.Done()
	defer c.close()
	var buf, out []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(chunk)
		if n > 0 {
			buf = append(buf, chunk[:n]...)
			for {
				size, ok, ferr := FrameLen(buf)
				if ferr != nil {
					return
				}
				if !ok {
					break
				}
				frame := buf[:size:size]
				buf = buf[size:]
				if frame[0] == '>' { // a push, not a reply
					out = append(out, frame...)
					continue
				}
				c.mu.Lock()
				name := ""
				if len(c.pending) > 0 {
					name = c.pending[0]
					c.pending = c.pending[1:]
				}
				c.mu.Unlock()
				if handshake(name) {
					out = append(out, frame...)
					continue
				}
				f, hit, faulted := c.p.take()
				if !faulted {
					out = append(out, frame...)
					continue
				}
				if !c.flush(&out) {
					return
				}
				if f.Kind == Swallow {
					if f.OnHit != nil {
						f.OnHit(hit)
					}
					c.wait(f.Hold) // silent: nothing more is read or forwarded
					return         // and the deferred close drops the connection
				}
				if f.OnHit != nil {
					f.OnHit(hit)
				}
				if !c.wait(f.Hold) {
					return
				}
				out = append(out, frame...)
			}
			if !c.flush(&out) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *proxyConn) flush(out *[]byte) bool {
	if len(*out) == 0 {
		return true
	}
	_, err := c.client.Write(*out)
	*out = (*out)[:0]
	return err == nil
}

// wait sleeps for d, or until the proxy closes (false).
func (c *proxyConn) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.p.done:
		return false
	}
}

func handshake(name string) bool {
	switch name {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

// errFrame is a byte stream that is not RESP.
var errFrame = errors.New("testenv: not a RESP frame")

// FrameLen returns the length of the RESP2 or RESP3 frame at the start of b, with ok
// false when b holds only part of it. An attribute ('|') is counted with the frame it
// annotates.
func FrameLen(b []byte) (n int, ok bool, err error) {
	if len(b) == 0 {
		return 0, false, nil
	}
	end := bytes.Index(b, []byte("\r\n"))
	if end < 0 {
		return 0, false, nil
	}
	line := string(b[1:end])
	head := end + 2
	switch b[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return head, true, nil
	case '$', '!', '=':
		size, err := strconv.Atoi(line)
		if err != nil {
			return 0, false, fmt.Errorf("%w: bulk length %q", errFrame, line)
		}
		if size < 0 {
			return head, true, nil
		}
		if len(b) < head+size+2 {
			return 0, false, nil
		}
		return head + size + 2, true, nil
	case '*', '~', '>', '%', '|':
		count, err := strconv.Atoi(line)
		if err != nil {
			return 0, false, fmt.Errorf("%w: count %q", errFrame, line)
		}
		if b[0] == '%' || b[0] == '|' {
			count *= 2
		}
		if b[0] == '|' {
			count++ // the annotated frame
		}
		n = head
		for range max(count, 0) {
			m, ok, err := FrameLen(b[n:])
			if !ok || err != nil {
				return 0, false, err
			}
			n += m
		}
		return n, true, nil
	}
	return 0, false, fmt.Errorf("%w: type %q", errFrame, b[0])
}

// CommandName returns the lower-case name of the command in a complete request frame
// (an array of bulk strings, as go-redis sends), or "" if it is not one.
func CommandName(frame []byte) string {
	if len(frame) == 0 || frame[0] != '*' {
		return ""
	}
	i := bytes.Index(frame, []byte("\r\n"))
	if i < 0 || i+2 >= len(frame) || frame[i+2] != '$' {
		return ""
	}
	rest := frame[i+2:]
	j := bytes.Index(rest, []byte("\r\n"))
	if j < 0 {
		return ""
	}
	size, err := strconv.Atoi(string(rest[1:j]))
	if err != nil || size < 0 || len(rest) < j+2+size {
		return ""
	}
	return string(bytes.ToLower(rest[j+2 : j+2+size]))
}

var _ io.Closer = (*Proxy)(nil)
