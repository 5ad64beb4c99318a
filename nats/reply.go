package nats

import (
	natsgo "github.com/nats-io/nats.go"

	"github.com/dedupkit/dedupkit/internal/replycodec"
)

// Reply is the answer to a request: what a ReplyFunc returns, and what a Replier
// sends, to the first request and, stored with its DONE record, byte for byte to
// every duplicate of it. Header may be nil.
type Reply struct {
	Header natsgo.Header
	Data   []byte
}

// encodeReply is the stored form of r (internal/replycodec); its size is what the
// handler's WithReplies limit applies to.
func encodeReply(r Reply) []byte { return replycodec.Encode(r.Header, r.Data) }

// decodeReply reads a stored reply; one it cannot read is replycodec.ErrBad.
func decodeReply(s string) (Reply, error) {
	h, data, err := replycodec.Decode(s)
	return Reply{Header: h, Data: data}, err
}
