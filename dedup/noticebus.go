package dedup

import (
	"context"
	"errors"
	"time"
)

// The transport of forget notices: a store that deletes a record (RecordStore.Forget)
// sends a notice on the channel "<prefix>:<handler>" with the message key as payload,
// and the Dedupers on the store subscribe to the channels of their handlers (see
// notices.go for what they do with them).

// noticeBus is implemented by the stores that carry forget notices between the
// Dedupers on them. It is unexported: a notice must be sent by the store's Forget in
// the same step that deletes the record, and only RedisStore and MemoryStore do so.
type noticeBus interface {
	// subscribeNotices returns a subscription with no channel yet.
	subscribeNotices() noticeSub
	// noticeSubscribers returns how many subscriptions hold channel.
	noticeSubscribers(ctx context.Context, channel string) (int64, error)
}

var (
	_ noticeBus = (*RedisStore)(nil)
	_ noticeBus = (*MemoryStore)(nil)
)

// noticeSub is one subscription to forget notices. receive runs on one goroutine;
// add and close may run while it waits.
type noticeSub interface {
	// add subscribes to channels; a subscription that fails now is made later, on its
	// next connection.
	add(ctx context.Context, channels ...string) error
	// receive waits up to timeout for the next notice; errNoticeTimeout when none came.
	receive(ctx context.Context, timeout time.Duration) (notice, error)
	// ping asks for a reply (noticeHeard), to tell a live subscription from a dead one.
	ping(ctx context.Context) error
	close() error
}

type noticeKind uint8

const (
	noticeHeard      noticeKind = iota // a reply to ping, or anything else: the line is alive
	noticeSubscribed                   // channel is subscribed (again): notices before may be lost
	noticeForgotten                    // k was forgotten for the handler of channel
	noticeMissed                       // notices were lost (a queue overflowed)
)

type notice struct {
	kind    noticeKind
	channel string
	k       string
	// lossless, on noticeSubscribed: no notice can have been lost before it (an
	// in-process subscription), so the local tiers need not be dropped
	lossless bool
}

var errNoticeTimeout = errors.New("dedup: no notice")

// noticeRefused is receive's error when the server refused a subscription or a ping
// (an ACL): the connection itself is fine.
type noticeRefused struct{ err error }

func (e *noticeRefused) Error() string { return e.err.Error() }
func (e *noticeRefused) Unwrap() error { return e.err }
