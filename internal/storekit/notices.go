package storekit

import (
	"context"
	"errors"
	"time"
)

// Notifier is a store whose Forget publishes the message key on "<prefix>:<handler>"
// in the step that deletes the record, for the Dedupers on it.
type Notifier interface {
	ForgetNotices() Bus
}

// Bus is a store's forget-notice transport.
type Bus interface {
	// Subscribe returns a subscription with no channel yet.
	Subscribe() Sub
	// Subscribers returns how many subscriptions hold channel.
	Subscribers(ctx context.Context, channel string) (int64, error)
}

// Sub is one subscription to forget notices. Receive runs on one goroutine; Add and
// Close may run while it waits.
type Sub interface {
	// Add subscribes to channels; one that fails now is made on the next connection.
	Add(ctx context.Context, channels ...string) error
	// Receive waits up to timeout for the next notice; ErrNoNotice when none came.
	Receive(ctx context.Context, timeout time.Duration) (Notice, error)
	// Ping asks for a reply (Heard), to tell a live subscription from a dead one.
	Ping(ctx context.Context) error
	// InProcess reports a subscription made at once that never loses a notice.
	InProcess() bool
	Close() error
}

// NoticeKind says what a Notice is.
type NoticeKind uint8

const (
	Heard      NoticeKind = iota // a reply to Ping, or anything else: the line is alive
	Subscribed                   // Channel is subscribed (again): notices before may be lost
	Forgotten                    // K was forgotten for the handler of Channel
	Missed                       // notices were lost (a queue overflowed)
)

// Notice is one event of a subscription.
type Notice struct {
	Kind    NoticeKind
	Channel string
	K       string
	// Lossless, on Subscribed: no notice was lost before it, so the local tiers stay.
	Lossless bool
}

// ErrNoNotice is Receive's error when no notice came in time.
var ErrNoNotice = errors.New("dedup: no notice")

// Refused is Receive's error when the server refused a subscription or a ping (an
// ACL): the connection itself is fine.
type Refused struct{ Err error }

func (e *Refused) Error() string { return e.Err.Error() }
func (e *Refused) Unwrap() error { return e.Err }
