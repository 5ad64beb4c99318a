package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Message is the read-only view of a message that strategies read.
type Message interface {
	// Header returns the first value of the named header, "" when absent.
	Header(name string) string
	// Data returns the payload; strategies must not modify it.
	Data() []byte
}

// Strategy derives a message key from a message; "" means it has none. Keys are
// raw, of any size and content ([Normalize] bounds them). The built-in
// strategies never panic and are safe for concurrent use.
type Strategy interface {
	Key(m Message) string
}

// Validator is implemented by strategies that can be misconfigured. The dedup
// engine calls Validate when a handler is registered; the built-in strategies
// return errors wrapping [ErrInvalid].
type Validator interface {
	Validate() error
}

// Header names read by [CorrelationID], in order.
const (
	correlationHeader  = "Correlation-Id"
	xCorrelationHeader = "X-Correlation-Id"
)

// Header returns a strategy whose key is the first value of header name, as the
// Message looks it up. Validate fails with [ErrInvalid] when name is empty.
func Header(name string) Strategy { return headerStrategy{name: name} }

type headerStrategy struct{ name string }

func (s headerStrategy) Key(m Message) string {
	if m == nil || s.name == "" {
		return ""
	}
	return m.Header(s.name)
}

func (s headerStrategy) Validate() error {
	if s.name == "" {
		return invalidf("Header: empty header name")
	}
	return nil
}

// CorrelationID returns a strategy whose key is the "Correlation-Id" header,
// else the "X-Correlation-Id" header.
func CorrelationID() Strategy { return correlationStrategy{} }

type correlationStrategy struct{}

func (correlationStrategy) Key(m Message) string {
	if m == nil {
		return ""
	}
	if k := m.Header(correlationHeader); k != "" {
		return k
	}
	return m.Header(xCorrelationHeader)
}

// Composite returns a strategy whose key joins the keys of parts, each prefixed
// by its length and ':' (keys "ab" and "c" give "2:ab1:c"), so that no two
// lists of keys join alike. If a part finds no key, neither does Composite.
// Validate fails with [ErrInvalid] when parts is empty, holds nil, or a part's
// Validate fails.
func Composite(parts ...Strategy) Strategy {
	return compositeStrategy{parts: append([]Strategy(nil), parts...)}
}

type compositeStrategy struct{ parts []Strategy }

func (s compositeStrategy) Key(m Message) string {
	if len(s.parts) == 0 {
		return ""
	}
	// Small composites (the usual case) avoid a heap-allocated slice of keys.
	var buf [4]string
	ks := buf[:0]
	n := 0
	for _, p := range s.parts {
		if p == nil {
			return ""
		}
		k := p.Key(m)
		if k == "" {
			return ""
		}
		ks = append(ks, k)
		n += len(k) + 1 + decimalLen(len(k))
	}
	var sb strings.Builder
	sb.Grow(n)
	var digits [20]byte
	for _, k := range ks {
		sb.Write(strconv.AppendInt(digits[:0], int64(len(k)), 10))
		sb.WriteByte(':')
		sb.WriteString(k)
	}
	return sb.String()
}

func (s compositeStrategy) Validate() error {
	return validateList("Composite", s.parts)
}

// decimalLen returns the number of decimal digits of n >= 0.
func decimalLen(n int) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// Payload returns a strategy whose key is the hex SHA-256 of the payload; an
// empty payload has no key. Messages with equal payloads are duplicates under it.
func Payload() Strategy { return payloadStrategy{} }

type payloadStrategy struct{}

func (payloadStrategy) Key(m Message) string {
	if m == nil {
		return ""
	}
	d := m.Data()
	if len(d) == 0 {
		return ""
	}
	sum := sha256.Sum256(d)
	var h [2 * sha256.Size]byte
	hex.Encode(h[:], sum[:])
	return string(h[:])
}

// Custom returns a strategy whose key is fn(m). fn must be safe for concurrent
// use and must not modify m; its panics are not recovered. Validate fails with
// [ErrInvalid] when fn is nil.
func Custom(fn func(Message) string) Strategy { return customStrategy{fn: fn} }

type customStrategy struct{ fn func(Message) string }

func (s customStrategy) Key(m Message) string {
	if s.fn == nil {
		return ""
	}
	return s.fn(m)
}

func (s customStrategy) Validate() error {
	if s.fn == nil {
		return invalidf("Custom: nil func")
	}
	return nil
}

// FirstOf returns a strategy whose key is the first non-empty key of
// strategies, tried in order. Validate fails with [ErrInvalid] when strategies
// is empty, holds nil, or a member's Validate fails.
func FirstOf(strategies ...Strategy) Strategy {
	return firstOfStrategy{list: append([]Strategy(nil), strategies...)}
}

type firstOfStrategy struct{ list []Strategy }

func (s firstOfStrategy) Key(m Message) string {
	for _, st := range s.list {
		if st == nil {
			continue
		}
		if k := st.Key(m); k != "" {
			return k
		}
	}
	return ""
}

func (s firstOfStrategy) Validate() error {
	return validateList("FirstOf", s.list)
}

// validateList checks the members of a Composite or FirstOf.
func validateList(ctor string, list []Strategy) error {
	if len(list) == 0 {
		return invalidf("%s: no strategies", ctor)
	}
	for i, st := range list {
		if st == nil {
			return invalidf("%s: strategy %d is nil", ctor, i)
		}
		if v, ok := st.(Validator); ok {
			if err := v.Validate(); err != nil {
				return memberErr(ctor, i, err)
			}
		}
	}
	return nil
}

// Raw is a [Message] built from plain values, for tests and non-NATS sources.
// The zero value is an empty message with no headers and no payload.
type Raw struct {
	// Headers maps a header name to its (first) value; names match exactly.
	Headers map[string]string
	// Body is the payload.
	Body []byte
}

// Header returns the value of header name, "" when absent; names match exactly.
func (r Raw) Header(name string) string { return r.Headers[name] }

// Data returns Body, which may be nil.
func (r Raw) Data() []byte { return r.Body }
