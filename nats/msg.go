package nats

import (
	"net/textproto"
	"strconv"
	"sync"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/keys"
)

// Msg is the read-only view of a delivery that a handler sees. The adapter owns the
// acknowledgement, so Msg has no Ack methods. Use it by pointer: a Msg must not be
// copied (it reads its JetStream metadata once, on first use).
type Msg struct {
	subject string
	header  natsgo.Header
	data    []byte
	// js is a JetStream delivery whose metadata is read from its reply subject on
	// first use (metaOnce): a message that is handled once and acked needs none.
	js       jetstream.Msg
	metaOnce sync.Once
	meta     *jetstream.MsgMetadata
}

var _ keys.Message = (*Msg)(nil)

// Subject returns the subject the message was published to.
func (m *Msg) Subject() string { return m.subject }

// Headers returns the message headers (nil when there are none). Do not modify them.
func (m *Msg) Headers() natsgo.Header { return m.header }

// Header returns the first value of the named header, "" when absent. The name is
// matched as given, then in canonical MIME form (Nats-Msg-Id).
func (m *Msg) Header(name string) string {
	if m.header == nil {
		return ""
	}
	if v := m.header[name]; len(v) > 0 {
		return v[0]
	}
	// nats.Header.Get is case-sensitive: look the canonical form up ourselves
	if v := m.header[textproto.CanonicalMIMEHeaderKey(name)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Data returns the payload. Do not modify it.
func (m *Msg) Data() []byte { return m.data }

// Metadata returns the JetStream delivery metadata: stream, sequences, NumDelivered.
// It is nil for a core NATS message.
func (m *Msg) Metadata() *jetstream.MsgMetadata {
	if m.js != nil {
		m.metaOnce.Do(m.parseMeta)
	}
	return m.meta
}

func (m *Msg) parseMeta() {
	if md, err := m.js.Metadata(); err == nil {
		m.meta = md
	}
}

// NumDelivered returns how many times JetStream has delivered the message (1 the first
// time); 0 for a core NATS message.
func (m *Msg) NumDelivered() uint64 {
	if md := m.Metadata(); md != nil {
		return md.NumDelivered
	}
	return 0
}

func viewJS(msg jetstream.Msg) *Msg {
	m := new(Msg)
	setJS(m, msg)
	return m
}

// setJS makes the zero m a view of msg.
func setJS(m *Msg, msg jetstream.Msg) {
	m.subject, m.header, m.data, m.js = msg.Subject(), msg.Headers(), msg.Data(), msg
}

func viewCore(msg *natsgo.Msg) *Msg {
	m := &Msg{subject: msg.Subject, header: msg.Header, data: msg.Data}
	if msg.Reply != "" {
		if md, err := msg.Metadata(); err == nil { // a JetStream push delivery
			m.meta = &jetstream.MsgMetadata{
				Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
				NumDelivered: md.NumDelivered,
				NumPending:   md.NumPending,
				Timestamp:    md.Timestamp,
				Stream:       md.Stream,
				Consumer:     md.Consumer,
				Domain:       md.Domain,
			}
		}
	}
	return m
}

// StreamSequence is the key strategy "js:<stream>:<stream sequence>". It is stable
// across redeliveries of one stored message and different for a republished one.
// Messages without JetStream metadata have no such key.
func StreamSequence() keys.Strategy { return streamSeq{} }

type streamSeq struct{}

func (streamSeq) Key(msg keys.Message) string {
	m, ok := msg.(*Msg)
	if !ok || m == nil {
		return ""
	}
	md := m.Metadata()
	if md == nil || md.Stream == "" {
		return ""
	}
	return "js:" + md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// DefaultKeyStrategy is the key order of every adapter (JetStream, Core, Replier):
// dedup.DefaultKeyStrategy (the Idempotency-Key header, else Nats-Msg-Id), else, for
// a JetStream delivery, StreamSequence. JetStream's own duplicate window drops a
// republished message with a Nats-Msg-Id it has seen before it reaches a consumer.
var DefaultKeyStrategy = keys.FirstOf(dedup.DefaultKeyStrategy, StreamSequence())
