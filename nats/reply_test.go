package nats

import (
	"bytes"
	"reflect"
	"testing"

	natsgo "github.com/nats-io/nats.go"
)

// The stored form of a reply gives back exactly what went in: data of any bytes,
// headers with any keys and values (empty ones, several, separators, CR LF), the
// same form for one reply whatever the order of its header map.
func TestStoredReplyDecodesToExactlyWhatWasEncoded(t *testing.T) {
	for _, r := range []Reply{
		{},
		{Data: []byte("plain")},
		{Header: natsgo.Header{"A": {""}}, Data: nil},
		{Header: natsgo.Header{"b": {"2", "1"}, "A": {"x:y", "\r\n"}, "": {"empty key"}}, Data: []byte{0, 1, 0xff, '\n'}},
		theReply(),
	} {
		enc := encodeReply(r)
		got, err := decodeReply(string(enc))
		if err != nil {
			t.Fatalf("decode(encode(%v)): %v", r, err)
		}
		if !bytes.Equal(got.Data, r.Data) || len(got.Header) != len(r.Header) || (len(r.Header) > 0 && !reflect.DeepEqual(got.Header, r.Header)) {
			t.Fatalf("decode(encode(%v)) = %v", r, got)
		}
		for range 5 { // map order does not change the form
			if again := encodeReply(Reply{Header: maps2(r.Header), Data: r.Data}); !bytes.Equal(again, enc) {
				t.Fatalf("two forms of one reply: %q, %q", enc, again)
			}
		}
	}
	for _, bad := range []string{"", "\x02", "\x01", "\x01\x05", "\x01\x01\x05ab", "\x01\x01\x01a\x02\x01x", "\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"} {
		if _, err := decodeReply(bad); err == nil {
			t.Fatalf("decodeReply(%q) accepted", bad)
		}
	}
}

func maps2(h natsgo.Header) natsgo.Header {
	if h == nil {
		return nil
	}
	out := make(natsgo.Header, len(h))
	for k, v := range h {
		out[k] = v
	}
	return out
}
