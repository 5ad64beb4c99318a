// Package replycodec is the stored form of package nats's Reply, the opaque bytes the
// engine keeps with DONE: a version byte (1); the number of header keys; each key, in
// sorted order, as its length and bytes, then the number of its values and each as
// its length and bytes (every number an unsigned varint); then the data, to the end.
// Length-prefixed, so that any header or data survives exactly; sorted, so that one
// reply always has one form. A package of its own, so that its fuzz test builds
// without the NATS server the nats package's tests embed.
package replycodec

import (
	"encoding/binary"
	"errors"
	"slices"
)

// format is the stored form's version byte.
const format = 1

// ErrBad is a stored reply Decode cannot read (written by another program on the
// same handler, or corrupted).
var ErrBad = errors.New("nats: stored reply unreadable")

// Encode is the stored form of a reply of header h and data.
func Encode(h map[string][]string, data []byte) []byte {
	n := 1 + binary.MaxVarintLen64 + len(data)
	keys := make([]string, 0, len(h))
	for k, vs := range h {
		keys = append(keys, k)
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = append(b, format)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, data...)
}

// Decode reads a stored reply. The data is a copy (a message's data may be changed
// by its receiver); a reply without headers has a nil h, one without data nil data.
func Decode(s string) (h map[string][]string, data []byte, err error) {
	if len(s) == 0 || s[0] != format {
		return nil, nil, ErrBad
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
		return nil, nil, ErrBad
	}
	if nk > 0 {
		h = make(map[string][]string, nk)
	}
	for range nk {
		k, ok1 := str()
		nv, ok2 := num()
		if !ok1 || !ok2 {
			return nil, nil, ErrBad
		}
		vs := make([]string, nv)
		for j := range vs {
			if vs[j], ok = str(); !ok {
				return nil, nil, ErrBad
			}
		}
		h[k] = vs
	}
	if len(s) > 0 {
		data = []byte(s)
	}
	return h, data, nil
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
