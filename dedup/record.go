package dedup

import (
	"fmt"
	"strings"
	"time"
)

// A record value is "<state>:<token>:<fingerprint>", state 'p' (IN PROGRESS) or 'd'
// (DONE). Tokens hold no ':', so the first two separators split it unambiguously; the
// Lua scripts parse it with the same rule.
const (
	stateInProgress = 'p'
	stateDone       = 'd'
	maxTokenLen     = 64
)

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

func decodeRecord(v string) (state byte, token, fingerprint string, ok bool) {
	if len(v) < 3 || (v[0] != stateInProgress && v[0] != stateDone) || v[1] != ':' {
		return 0, "", "", false
	}
	rest := v[2:]
	i := strings.IndexByte(rest, ':')
	if i < 0 {
		return 0, "", "", false
	}
	return v[0], rest[:i], rest[i+1:], true
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
