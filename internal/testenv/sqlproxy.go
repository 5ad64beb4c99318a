package testenv

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Wire is the protocol a SQLProxy reads: enough of it to find a COMMIT.
type Wire uint8

const (
	// PostgresWire is PostgreSQL's frontend/backend protocol (a COMMIT is a simple
	// Query message, as pgx sends it).
	PostgresWire Wire = iota + 1
	// MySQLWire is the MySQL/MariaDB client/server protocol (a COMMIT is a
	// COM_QUERY packet).
	MySQLWire
)

// CommitFault is what a SQLProxy does to the next COMMIT once armed.
type CommitFault uint8

const (
	// CutBeforeCommit drops the COMMIT and closes both sides of its connection: the
	// server never sees it and rolls the transaction back; the client loses the
	// connection with the COMMIT in flight.
	CutBeforeCommit CommitFault = iota + 1
	// CutAfterCommit forwards the COMMIT, waits for the server's first reply bytes
	// (the commit is done), drops them and closes both sides: committed, and the
	// client loses the connection with the COMMIT in flight.
	CutAfterCommit
	// RejectCommit (MySQLWire only) sends the server ROLLBACK in the COMMIT's
	// place and answers the client with the error packet a refused commit gets
	// (1213, SQLSTATE 40001, as a Galera certification failure does): rolled back,
	// and the server's refusal reaches the client as a server error.
	RejectCommit
	// CutAtStatement drops the next message the client sends, COMMIT or not (a
	// handler's statement), and closes both sides: the server rolls the transaction
	// back, and the client's driver learns from that statement that the connection
	// is lost, before it sends any COMMIT.
	CutAtStatement
)

// SQLProxy is a loopback TCP proxy in front of a PostgreSQL or MySQL server that
// can fault the next COMMIT a client sends, on whichever connection, or reset the
// connection last used. It is in pass-through mode until ArmCommit or ResetLast.
// Safe for concurrent use.
type SQLProxy struct {
	wire     Wire
	upstream string
	ln       net.Listener
	done     chan struct{}
	wg       sync.WaitGroup
	hits     atomic.Int64
	oneWay   atomic.Int64            // SetLatency's delay each way, in nanoseconds
	last     atomic.Pointer[sqlConn] // the connection of the last client message

	mu    sync.Mutex
	conns map[*sqlConn]struct{}
	armed CommitFault // 0: none
}

// SetLatency makes every round trip through the proxy's later connections take rtt
// longer, as a network between client and server would: the bytes read from either
// side are written to the other rtt/2 after they arrived, in order, without holding
// up the bytes behind them. Zero, the default, forwards at once.
func (p *SQLProxy) SetLatency(rtt time.Duration) { p.oneWay.Store(int64(rtt / 2)) }

// NewSQLProxy listens on a free loopback port and forwards every connection to
// upstream (host:port). Close it when done.
func NewSQLProxy(wire Wire, upstream string) (*SQLProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &SQLProxy{wire: wire, upstream: upstream, ln: ln, done: make(chan struct{}), conns: map[*sqlConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients dial.
func (p *SQLProxy) Addr() string { return p.ln.Addr().String() }

// ArmCommit makes the next COMMIT suffer f (CutAtStatement: the next message),
// replacing a fault still armed.
func (p *SQLProxy) ArmCommit(f CommitFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = f
}

// Hits returns how many messages (COMMITs, or a statement for CutAtStatement) have
// been faulted.
func (p *SQLProxy) Hits() int64 { return p.hits.Load() }

// take returns the fault armed for the client's message about to be forwarded
// (commit: it is a COMMIT), disarming it; 0 for none.
func (p *SQLProxy) take(commit bool) CommitFault {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.armed
	if !commit && f != CutAtStatement {
		return 0
	}
	p.armed = 0
	if f != 0 {
		p.hits.Add(1)
	}
	return f
}

// ResetLast resets the connection the last client message came through, between
// messages: the client's side is closed with an RST (SO_LINGER 0), so that the
// client's next write fails with nothing sent (ECONNRESET), and the server's side
// is closed, so that the server rolls back the transaction it held. Other
// connections (a pool's idle ones) are left alone. It reports whether there was a
// connection to reset; over loopback the RST has reached the client when it
// returns.
func (p *SQLProxy) ResetLast() bool {
	c := p.last.Load()
	if c == nil {
		return false
	}
	if tc, ok := c.client.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.close()
	return true
}

// Close stops the proxy: it closes the listener and every connection, and waits for
// its goroutines.
func (p *SQLProxy) Close() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	close(p.done)
	err := p.ln.Close()
	p.mu.Lock()
	conns := make([]*sqlConn, 0, len(p.conns))
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

func (p *SQLProxy) accept() {
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
		c := &sqlConn{p: p, client: client, server: server}
		if d := time.Duration(p.oneWay.Load()); d > 0 {
			c.toServer, c.toClient = c.lane(server, d), c.lane(client, d)
		}
		p.mu.Lock()
		select {
		case <-p.done:
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

// sqlConn is one client connection and its server connection.
type sqlConn struct {
	p              *SQLProxy
	client, server net.Conn
	once           sync.Once
	// onReply is the fault the server's next reply meets (a CommitFault; 0: none).
	onReply atomic.Uint32
	// toServer and toClient delay what is written to each side (SetLatency); nil
	// writes at once.
	toServer, toClient chan<- []byte
}

// lane returns a channel whose byte slices are written to dst d after they were
// sent, in order. The reading side closes it when it ends.
func (c *sqlConn) lane(dst net.Conn, d time.Duration) chan<- []byte {
	type due struct {
		b  []byte
		at time.Time
	}
	in := make(chan []byte)
	q := make(chan due, 4096)
	c.p.wg.Add(2)
	go func() { // stamps each slice as it comes, so a slow write delays none
		defer c.p.wg.Done()
		defer close(q)
		for b := range in {
			q <- due{b, time.Now().Add(d)}
		}
	}()
	go func() {
		defer c.p.wg.Done()
		for x := range q {
			time.Sleep(time.Until(x.at))
			if _, err := dst.Write(x.b); err != nil {
				c.close()
			}
		}
	}()
	return in
}

// write writes b to dst, through lane when there is one (b is copied: the
// caller reuses it).
func write(dst net.Conn, lane chan<- []byte, b []byte) error {
	if lane == nil {
		_, err := dst.Write(b)
		return err
	}
	lane <- bytes.Clone(b)
	return nil
}

func (c *sqlConn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// requests forwards the client's messages one whole message at a time, so that a
// COMMIT (or, for CutAtStatement, any message) can be held back or replaced.
func (c *sqlConn) requests() {
	defer c.p.wg.Done()
	defer c.close()
	if c.toServer != nil {
		defer close(c.toServer)
	}
	var buf []byte
	chunk := make([]byte, 32<<10)
	startup := true // PostgreSQL: the first messages carry no type byte
	for {
		n, err := c.client.Read(chunk)
		buf = append(buf, chunk[:n]...)
		for {
			size, commit := c.frame(buf, &startup)
			if size == 0 {
				break
			}
			msg := buf[:size]
			buf = buf[size:]
			c.p.last.Store(c)
			if f := c.p.take(commit); f != 0 {
				switch f {
				case CutBeforeCommit, CutAtStatement:
					return
				case RejectCommit:
					msg = mysqlQuery(msg[3], "ROLLBACK")
				}
				c.onReply.Store(uint32(f))
			}
			if werr := write(c.server, c.toServer, msg); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// frame returns the size of the whole message at the start of b (0 when b holds
// only part of one), and whether it is a COMMIT.
func (c *sqlConn) frame(b []byte, startup *bool) (size int, commit bool) {
	switch c.p.wire {
	case PostgresWire:
		if *startup {
			if len(b) < 8 {
				return 0, false
			}
			size = int(binary.BigEndian.Uint32(b))
			if len(b) < size {
				return 0, false
			}
			// SSLRequest and GSSENCRequest are followed by another startup message.
			if code := binary.BigEndian.Uint32(b[4:]); code != 80877103 && code != 80877104 {
				*startup = false
			}
			return size, false
		}
		if len(b) < 5 {
			return 0, false
		}
		size = 1 + int(binary.BigEndian.Uint32(b[1:]))
		if len(b) < size {
			return 0, false
		}
		return size, b[0] == 'Q' && isCommit(b[5:size])
	default:
		if len(b) < 4 {
			return 0, false
		}
		size = 4 + (int(b[0]) | int(b[1])<<8 | int(b[2])<<16)
		if len(b) < size {
			return 0, false
		}
		return size, size > 5 && b[4] == 0x03 && isCommit(b[5:size])
	}
}

func isCommit(q []byte) bool {
	s := strings.TrimRight(strings.TrimSpace(string(bytes.TrimRight(q, "\x00"))), ";")
	return strings.EqualFold(strings.TrimSpace(s), "commit")
}

// mysqlQuery returns a COM_QUERY packet with sequence number seq.
func mysqlQuery(seq byte, query string) []byte {
	n := 1 + len(query)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq, 0x03}, query...)
}

// mysqlRejected is the error packet a refused commit gets, with sequence number seq.
func mysqlRejected(seq byte) []byte {
	payload := []byte{0xff, 0xbd, 0x04, '#', '4', '0', '0', '0', '1'}
	payload = append(payload, "Deadlock found when trying to get lock; try restarting transaction (test proxy)"...)
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

// replies forwards the server's bytes, meeting a fault armed on the reply to a
// COMMIT. The client waits for that reply before it sends more, so the reply starts
// the first read after the COMMIT went out.
func (c *sqlConn) replies() {
	defer c.p.wg.Done()
	defer c.close()
	if c.toClient != nil {
		defer close(c.toClient)
	}
	var buf []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(chunk)
		if n > 0 {
			out := chunk[:n]
			switch CommitFault(c.onReply.Load()) {
			case CutAfterCommit:
				return // the commit is done; its reply is dropped with the connection
			case RejectCommit:
				buf = append(buf, out...)
				if len(buf) < 4 || len(buf) < 4+(int(buf[0])|int(buf[1])<<8|int(buf[2])<<16) {
					continue
				}
				size := 4 + (int(buf[0]) | int(buf[1])<<8 | int(buf[2])<<16)
				out = append(mysqlRejected(buf[3]), buf[size:]...)
				buf = nil
				c.onReply.Store(0)
			}
			if werr := write(c.client, c.toClient, out); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
