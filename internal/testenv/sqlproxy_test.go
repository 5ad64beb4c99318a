package testenv

import (
	"encoding/binary"
	"testing"
)

func pgMessage(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// The proxy finds a COMMIT in each protocol's framing, whole or split across
// reads, and nothing else.
func TestSQLProxyFindsACommitInEachProtocolsFraming(t *testing.T) {
	pg := &sqlConn{p: &SQLProxy{wire: PostgresWire}}
	startup := []byte{0, 0, 0, 8, 0, 3, 0, 0} // protocol 3.0, no parameters
	inStartup := true
	if size, commit := pg.frame(startup, &inStartup); size != 8 || commit || inStartup {
		t.Fatalf("startup: size %d commit %v still in startup %v", size, commit, inStartup)
	}
	for _, c := range []struct {
		msg    []byte
		commit bool
	}{
		{pgMessage('Q', "commit\x00"), true},
		{pgMessage('Q', "COMMIT;\x00"), true},
		{pgMessage('Q', "select 'commit'\x00"), false},
		{pgMessage('P', "commit\x00"), false},
		{pgMessage('Q', "rollback\x00"), false},
	} {
		started := false
		if size, commit := pg.frame(c.msg, &started); size != len(c.msg) || commit != c.commit {
			t.Errorf("%q: size %d commit %v, want %d %v", c.msg, size, commit, len(c.msg), c.commit)
		}
		if size, _ := pg.frame(c.msg[:len(c.msg)-1], &started); size != 0 {
			t.Errorf("%q cut short: size %d, want 0", c.msg, size)
		}
	}
	my := &sqlConn{p: &SQLProxy{wire: MySQLWire}}
	for _, c := range []struct {
		msg    []byte
		commit bool
	}{
		{mysqlQuery(0, "COMMIT"), true},
		{mysqlQuery(0, "commit"), true},
		{mysqlQuery(0, "SELECT 1"), false},
		{append([]byte{7, 0, 0, 0, 0x16}, "COMMIT"...), false}, // COM_STMT_PREPARE
	} {
		var no bool
		if size, commit := my.frame(c.msg, &no); size != len(c.msg) || commit != c.commit {
			t.Errorf("%q: size %d commit %v, want %d %v", c.msg, size, commit, len(c.msg), c.commit)
		}
		if size, _ := my.frame(c.msg[:len(c.msg)-1], &no); size != 0 {
			t.Errorf("%q cut short: size %d, want 0", c.msg, size)
		}
	}
	// The refusal packet is an ERR packet with the given sequence number.
	if p := mysqlRejected(1); p[3] != 1 || p[4] != 0xff || binary.LittleEndian.Uint16(p[5:]) != 1213 || int(p[0]) != len(p)-4 {
		t.Fatalf("refusal packet %x", p)
	}
}

// A commit fault meets only a COMMIT; CutAtStatement meets the next message,
// whatever it is. Each is met once.
func TestSQLProxyFaultMeetsItsMessageOnce(t *testing.T) {
	p := &SQLProxy{}
	p.ArmCommit(CutBeforeCommit)
	if f := p.take(false); f != 0 {
		t.Fatalf("a statement met %v armed for the COMMIT", f)
	}
	if f := p.take(true); f != CutBeforeCommit {
		t.Fatalf("the COMMIT met %v, want CutBeforeCommit", f)
	}
	if f := p.take(true); f != 0 {
		t.Fatalf("the next COMMIT met %v: the fault was not disarmed", f)
	}
	p.ArmCommit(CutAtStatement)
	if f := p.take(false); f != CutAtStatement {
		t.Fatalf("a statement met %v, want CutAtStatement", f)
	}
	if f := p.take(false); f != 0 {
		t.Fatalf("the next statement met %v: the fault was not disarmed", f)
	}
	if p.Hits() != 2 {
		t.Fatalf("%d hits, want 2", p.Hits())
	}
	if p.ResetLast() {
		t.Fatal("ResetLast reset a connection before any message")
	}
}
