package dedup

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A record value is one of:
//
//	p:<token>:<fingerprint>                             IN PROGRESS
//	d:<token>:<fingerprint>                             DONE
//	r:<token>:<len(fingerprint)>:<fingerprint><reply>   DONE, with a stored reply (docs/design.md §10)
//
// Tokens hold no ':', so the first two separators split the first two forms
// unambiguously (a fingerprint may hold anything). The third carries the
// fingerprint's length in decimal, so that the reply, binary and of any content,
// is the rest. The Lua scripts parse records with the same rules.
//
// The third form has its own state letter so that a process from before stored
// replies, which knows only 'p' and 'd', cannot misread one: its scripts and its
// decoder refuse the value as a record dedup did not write (ErrBadRecord), which it
// answers as a store failure (fail closed: the message is redelivered, never run
// and never dropped; under FailOpen it runs). New processes read all three forms.
// Only handlers WithReplies write the third, so upgrade every process first, then
// turn replies on.
const (
	stateInProgress = 'p'
	stateDone       = 'd'
	stateReply      = 'r' // DONE with a reply; parseRecord reports it as stateDone
	maxTokenLen     = 64
)

// record is a parsed record value.
type record struct {
	state    byte // stateInProgress or stateDone (with a reply or not)
	token    string
	fp       string
	reply    string // the stored reply, when hasReply (a DONE record of the third form)
	hasReply bool
}

func encodeRecord(state byte, token, fingerprint string) string {
	var b strings.Builder
	b.Grow(3 + len(token) + len(fingerprint))
	b.WriteByte(state)
	b.WriteByte(':')
	b.WriteString(token)
	b.WriteByte(':')
	b.WriteString(fingerprint)
	return b.String()
}

// encodeReplyRecord encodes a DONE record with a stored reply.
func encodeReplyRecord(token, fingerprint, reply string) string {
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

// parseRecord parses a record value; ok is false for a value dedup did not write.
func parseRecord(v string) (r record, ok bool) {
	if len(v) < 3 || v[1] != ':' {
		return record{}, false
	}
	rest := v[2:]
	i := strings.IndexByte(rest, ':')
	if i < 0 {
		return record{}, false
	}
	r.token, rest = rest[:i], rest[i+1:]
	switch v[0] {
	case stateInProgress, stateDone:
		r.state, r.fp = v[0], rest
		return r, true
	case stateReply:
		// <len(fingerprint)>:<fingerprint><reply>: the length is decimal digits, as
		// Lua's %d+ reads them
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if j == 0 || j == len(rest) || rest[j] != ':' || j > 7 {
			return record{}, false
		}
		n, err := strconv.Atoi(rest[:j])
		rest = rest[j+1:]
		if err != nil || n > len(rest) {
			return record{}, false
		}
		r.state, r.fp, r.reply, r.hasReply = stateDone, rest[:n], rest[n:], true
		return r, true
	}
	return record{}, false
}

// fingerprintsDiffer reports key reuse: both sides fingerprinted, and differently.
func fingerprintsDiffer(stored, given string) bool {
	return stored != "" && given != "" && stored != given
}

func checkToken(token string) error {
	if token == "" || len(token) > maxTokenLen || strings.IndexByte(token, ':') >= 0 {
		return fmt.Errorf("%w: token must be 1..%d bytes without ':'", ErrInvalidOption, maxTokenLen)
	}
	return nil
}

func checkTTL(what string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("%w: %s %v is below 1ms", ErrInvalidOption, what, d)
	}
	return nil
}

func checkEntry(e Entry, what string) error {
	if err := checkToken(e.Token); err != nil {
		return err
	}
	return checkTTL(what, e.TTL)
}
