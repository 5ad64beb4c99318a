package replycodec

import (
	"reflect"
	"testing"
)

// FuzzReplyCodec: Decode never panics, and what it reads it reads again the same
// from its own encoding (a form it reads but does not write, with redundant varint
// bytes or keys out of order, included). The round trip of every kind of header and
// data is package nats's TestStoredReplyDecodesToExactlyWhatWasEncoded.
func FuzzReplyCodec(f *testing.F) {
	f.Add(string(Encode(map[string][]string{"Order-Id": {"o-42"}, "X-Multi": {"one", "two"}, "": {""}}, []byte("\x00\xff\r\nNATS/1.0\r\n"))))
	f.Add("\x01\x00data")
	f.Fuzz(func(t *testing.T, s string) {
		h, data, err := Decode(s)
		if err != nil {
			return
		}
		h2, data2, err := Decode(string(Encode(h, data)))
		if err != nil || !reflect.DeepEqual(h2, h) || !reflect.DeepEqual(data2, data) {
			t.Fatalf("Decode(%q) = %v %q, and from its encoding %v %q (%v)", s, h, data, h2, data2, err)
		}
	})
}
