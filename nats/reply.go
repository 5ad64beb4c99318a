package nats

import (
	"encoding/binary"
	"errors"
	"slices"

	natsgo "github.com/nats-io/nats.go"
)

// Reply is the answer to a request: what a ReplyFunc returns, and what a Replier
// sends, to the first request and, stored with its DONE record, byte for byte to
// every duplicate of it. Header may be nil.
type Reply struct {
	Header natsgo.Header
	Data   []byte
}

// The stored form of a Reply, the opaque bytes the engine keeps with DONE: a version
// byte (1); the number of header keys; each key, in sorted order, as its length and
// bytes, then the number of its values and each as its length and bytes (every
// number an unsigned varint); then the data, to the end. Length-prefixed, so that any
// header or data survives exactly; sorted, so that one reply always has one form.
const replyFormat = 1

// errBadReply is a stored reply this package cannot read (written by another program
// on the same handler, or corrupted).
var errBadReply = errors.New("nats: stored reply unreadable")

// encodeReply is the stored form of r; its size is what the handler's WithReplies
// limit applies to.
func encodeReply(r Reply) []byte {
	n := 1 + binary.MaxVarintLen64 + len(r.Data)
	keys := make([]string, 0, len(r.Header))
	for k, vs := range r.Header {
		keys = append(keys, k)
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = append(b, replyFormat)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		vs := r.Header[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, r.Data...)
}

// decodeReply reads a stored reply. The data is a copy (a Msg's Data may be changed
// by its receiver); a reply without headers has a nil Header.
func decodeReply(s string) (Reply, error) {
	if len(s) == 0 || s[0] != replyFormat {
		return Reply{}, errBadReply
	}
	s = s[1:]
	num := func() (int, bool) {
		v, n := uvarint(s)
		if n <= 0 || v > uint64(len(s)) { // no count or length exceeds what is left
			return 0, false
		}
		s = s[n:]
		return int(v), true
	}
	str := func() (string, bool) {
		l, ok := num()
		if !ok || l > len(s) {
			return "", false
		}
		v := s[:l]
		s = s[l:]
		return v, true
	}
	nk, ok := num()
	if !ok {
		return Reply{}, errBadReply
	}
	var r Reply
	if nk > 0 {
		r.Header = make(natsgo.Header, nk)
	}
	for range nk {
		k, ok1 := str()
		nv, ok2 := num()
		if !ok1 || !ok2 {
			return Reply{}, errBadReply
		}
		vs := make([]string, nv)
		for j := range vs {
			if vs[j], ok = str(); !ok {
				return Reply{}, errBadReply
			}
		}
		r.Header[k] = vs
	}
	if len(s) > 0 {
		r.Data = []byte(s)
	}
	return r, nil
}

// uvarint is binary.Uvarint for a string.
func uvarint(s string) (uint64, int) {
	var x uint64
	var shift uint
	for i := 0; i < len(s) && i < binary.MaxVarintLen64; i++ {
		c := s[i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				return 0, -(i + 1) // overflow
			}
			return x | uint64(c)<<shift, i + 1
		}
		x |= uint64(c&0x7f) << shift
		shift += 7
	}
	return 0, 0
}
