// Package storekit holds what the stores and the engine share but users do not
// see: the record encoding, argument checks and the forget-notice transport.
package storekit

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// A record value is one of:
//
//	p:<token>:<fingerprint>                             IN PROGRESS
//	d:<token>:<fingerprint>                             DONE
//	r:<token>:<len(fingerprint)>:<fingerprint><reply>   DONE, with a stored reply
//
// Tokens hold no ':', so the first two separators split the first two forms; the
// third gives the fingerprint's length, so the reply (any bytes) is the rest. The Lua
// scripts parse by the same rules. The third form has a letter of its own so that a
// process without stored replies refuses it (ErrBadRecord) rather than misreads it.
const (
	StateInProgress = 'p'
	StateDone       = 'd'
	StateReply      = 'r' // DONE with a reply; Parse reports it as StateDone
	MaxTokenLen     = 64
)

// Rec is a parsed record value.
type Rec struct {
	State    byte // StateInProgress or StateDone (with a reply or not)
	Token    string
	FP       string
	Reply    string // the stored reply, when HasReply (the third form)
	HasReply bool
}

// Encode encodes a record without a reply.
func Encode(state byte, token, fingerprint string) string {
	var b strings.Builder
	b.Grow(3 + len(token) + len(fingerprint))
	b.WriteByte(state)
	b.WriteByte(':')
	b.WriteString(token)
	b.WriteByte(':')
	b.WriteString(fingerprint)
	return b.String()
}

// EncodeReply encodes a DONE record with a stored reply.
func EncodeReply(token, fingerprint, reply string) string {
	var b strings.Builder
	b.Grow(8 + len(token) + len(fingerprint) + len(reply))
	b.WriteString("r:")
	b.WriteString(token)
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(len(fingerprint)))
	b.WriteByte(':')
	b.WriteString(fingerprint)
	b.WriteString(reply)
	return b.String()
}

// Parse parses a record value; ok is false for a value dedup did not write.
func Parse(v string) (r Rec, ok bool) {
	if len(v) < 3 || v[1] != ':' {
		return Rec{}, false
	}
	rest := v[2:]
	i := strings.IndexByte(rest, ':')
	if i < 0 {
		return Rec{}, false
	}
	r.Token, rest = rest[:i], rest[i+1:]
	switch v[0] {
	case StateInProgress, StateDone:
		r.State, r.FP = v[0], rest
		return r, true
	case StateReply:
		// <len(fingerprint)>:<fingerprint><reply>, the length in digits as Lua's %d+
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if j == 0 || j == len(rest) || rest[j] != ':' || j > 7 {
			return Rec{}, false
		}
		n, err := strconv.Atoi(rest[:j])
		rest = rest[j+1:]
		if err != nil || n > len(rest) {
			return Rec{}, false
		}
		r.State, r.FP, r.Reply, r.HasReply = StateDone, rest[:n], rest[n:], true
		return r, true
	}
	return Rec{}, false
}

// FingerprintsDiffer reports key reuse: both sides fingerprinted, and differently.
func FingerprintsDiffer(stored, given string) bool {
	return stored != "" && given != "" && stored != given
}

// CheckToken refuses a token that is empty, too long or holds a colon.
func CheckToken(token string) error {
	if token == "" || len(token) > MaxTokenLen || strings.IndexByte(token, ':') >= 0 {
		return fmt.Errorf("%w: token must be 1..%d bytes without ':'", driver.ErrInvalidOption, MaxTokenLen)
	}
	return nil
}

// CheckTTL refuses a lease or retention below a millisecond.
func CheckTTL(what string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("%w: %s %v is below 1ms", driver.ErrInvalidOption, what, d)
	}
	return nil
}

// CheckEntry checks an entry's token and TTL.
func CheckEntry(e driver.Entry, what string) error {
	if err := CheckToken(e.Token); err != nil {
		return err
	}
	return CheckTTL(what, e.TTL)
}

// CheckEntries checks every entry of a batch before anything is written. what names
// the TTL ("lease", "retention"); "" checks the tokens alone (Release).
func CheckEntries(entries []driver.Entry, what string) error {
	for _, e := range entries {
		var err error
		if what == "" {
			err = CheckToken(e.Token)
		} else {
			err = CheckEntry(e, what)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
