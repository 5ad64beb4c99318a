package nats

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/dedupkit/dedupkit/dedup"
)

// ReplyFunc handles one request and returns its reply. An error answers the request
// with an error reply (a *ServiceError's code and description, else 500), and
// releases the claim, so that a retry runs it again.
type ReplyFunc func(ctx context.Context, m *Msg) (Reply, error)

// ServiceError is an error a ReplyFunc returns to choose its error reply: Code and
// Description go in the Nats-Service-Error-Code and Nats-Service-Error headers, as
// nats.go/micro's Request.Error sends them, and Data is the payload. Like any error
// of fn, it releases the claim: it is not stored, and a retry runs fn again.
type ServiceError struct {
	Code        string // for example "400"
	Description string
	Data        []byte
}

// Error returns "nats: service error <code>: <description>".
func (e *ServiceError) Error() string {
	return "nats: service error " + e.Code + ": " + e.Description
}

// The error replies a Replier sends, by micro's convention (micro.ErrorHeader,
// micro.ErrorCodeHeader): a code and a description, stable, never holding the key,
// the request or the reply. 503 answers are worth retrying with the same key; the
// others are final for that key.
const (
	// CodeRetry (503): not now. The request is being run elsewhere (IN PROGRESS: a
	// retry after RetryAfterHeader gets its stored reply), or the store is
	// unavailable (fail closed: nothing ran), or the handler is shutting down.
	CodeRetry = "503"
	// CodeFailed (500): fn returned an error (not a *ServiceError) or panicked; its
	// claim is released, so a retry runs it again.
	CodeFailed = "500"
	// CodeNotStored (409): the request was processed already, and its reply was not
	// stored (larger than the handler's WithReplies limit, or its record was written
	// without one); running it again would repeat it, so it is not.
	CodeNotStored = "409"
	// CodeNoKey (400): the request has no key (the handler rejects such requests).
	CodeNoKey = "400"
	// CodeKeyReuse (422): the key was processed with another payload (fingerprints
	// differ); its stored reply is not this request's.
	CodeKeyReuse = "422"
)

// RetryAfterHeader is set on a CodeRetry reply to a request IN PROGRESS elsewhere:
// how many milliseconds to wait before retrying, what is left of the other
// owner's lease but at most WithRetryAfter.
const RetryAfterHeader = "Dedup-Retry-After-Ms"

// Descriptions of the error replies (the Nats-Service-Error header).
const (
	DescInProgress       = "dedup: request in progress; retry"
	DescStoreUnavailable = "dedup: store unavailable; retry"
	DescShuttingDown     = "dedup: shutting down; retry"
	DescNotCompleted     = "dedup: not completed; retry"
	DescFailed           = "dedup: handler failed"
	DescPanicked         = "dedup: handler panicked"
	DescNotStored        = "dedup: processed already; its reply was not stored"
	DescUnreadable       = "dedup: processed already; its stored reply is unreadable"
	DescNoKey            = "dedup: request has no key"
	DescKeyReuse         = "dedup: key reused with another payload"
)

// ReplyKind is what a Replier answered a request with.
type ReplyKind uint8

const (
	// ReplyRun: fn's reply, from the run the request made.
	ReplyRun ReplyKind = iota
	// ReplyStored: a duplicate's stored reply, the first run's.
	ReplyStored
	// ReplyRetry: a CodeRetry error reply.
	ReplyRetry
	// ReplyError: fn's error or panic (CodeFailed, or its ServiceError's code).
	ReplyError
	// ReplyNotStored: a CodeNotStored error reply.
	ReplyNotStored
	// ReplyRejected: CodeNoKey or CodeKeyReuse.
	ReplyRejected
	numReplyKinds
)

var replyKindNames = [numReplyKinds]string{"run", "stored", "retry", "error", "not-stored", "rejected"}

// String returns the kind in lower case, e.g. "not-stored".
func (k ReplyKind) String() string {
	if k < numReplyKinds {
		return replyKindNames[k]
	}
	return "invalid"
}

// ReplyStats counts what a Replier answered.
type ReplyStats struct {
	replies [numReplyKinds]uint64
	// RespondErrors counts replies the connection did not take (the requester's
	// inbox is not the Replier's concern: NATS does not say whether it listened).
	RespondErrors uint64
	// NoReplySubject counts messages without a reply subject: run, not answered.
	NoReplySubject uint64
}

// Count returns how many requests were answered with kind k.
func (s ReplyStats) Count(k ReplyKind) uint64 {
	if k >= numReplyKinds {
		return 0
	}
	return s.replies[k]
}

// Replier answers NATS requests through a dedup handler that stores replies
// (dedup.WithReplies), so that a request runs once and every retry of it gets
// the same answer. Handler serves a core NATS subscription, MicroHandler a
// nats.go/micro endpoint. The first request runs fn and gets its reply; a
// duplicate gets the stored reply, byte for byte (409 if none was stored), or
// waits for a run of it in this process; one in progress elsewhere gets a 503
// (CodeRetry), as does any request while the store is down or the handler shuts
// down; fn's error gets a 500, or its ServiceError's code, and releases the
// claim. Every request with a reply subject is answered; replies are never
// logged. docs/request-reply.md lists every case.
type Replier struct {
	a       adapter // its config (key strategy, concurrency, logger), dispatcher and Wait
	replies [numReplyKinds]atomic.Uint64
	respErr atomic.Uint64
	noReply atomic.Uint64
}

// NewReplier wraps h, which must store replies (dedup.WithReplies). The options
// that apply are WithKeyStrategy, WithConcurrency (Handler only), WithRetryAfter
// and WithLogger. Errors wrap dedup.ErrInvalidOption.
func NewReplier(h *dedup.Handler, opts ...Option) (*Replier, error) {
	cfg, err := newConfig(h, opts)
	if err != nil {
		return nil, err
	}
	if h.ReplyLimit() == 0 {
		return nil, invalid("handler %q does not store replies: register it WithReplies", h.Name())
	}
	return &Replier{a: adapter{h: h, cfg: cfg}}, nil
}

// Handler returns a nats.MsgHandler for Conn.Subscribe or QueueSubscribe that
// answers each request (Handle), up to WithConcurrency at once. ctx is the
// handlers' parent. After unsubscribing (or draining), call Wait.
func (r *Replier) Handler(ctx context.Context, fn ReplyFunc) natsgo.MsgHandler {
	if r == nil {
		return func(msg *natsgo.Msg) { _, _ = r.Handle(ctx, msg, fn) }
	}
	dispatch := r.a.dispatcher()
	if ctx != nil {
		ctx = dedup.WaitForRunning(ctx)
	}
	return func(msg *natsgo.Msg) {
		if msg == nil {
			r.a.cfg.logger.Error("dedup: nil request handed to the handler; dropped", "handler", r.a.h.Name())
			return
		}
		dispatch(func() { r.Handle(ctx, msg, fn) })
	}
}

// Handle answers one request on the caller's goroutine (see Replier) and returns
// the handler's result. A message without a reply subject is run and not answered.
func (r *Replier) Handle(ctx context.Context, msg *natsgo.Msg, fn ReplyFunc) (dedup.ItemResult, error) {
	if msg == nil {
		return dedup.ItemResult{}, ErrBadInput
	}
	if r == nil { // a NewReplier whose error was dropped: answered, never silence
		slog.Default().Error("dedup: request handed to a nil *Replier (did NewReplier fail?)")
		if msg.Reply != "" {
			a := answer{kind: ReplyError, code: CodeFailed, desc: errNoReplier}
			_ = msg.RespondMsg(&natsgo.Msg{Header: a.errorHeader()})
		}
		return dedup.ItemResult{}, ErrBadInput
	}
	var res dedup.ItemResult
	var err error
	r.serve(ctx, viewCore(msg), fn, func(a answer) {
		if msg.Reply == "" {
			r.noReply.Add(1)
			return
		}
		out := &natsgo.Msg{Header: a.reply.Header, Data: a.reply.Data}
		if a.code != "" {
			out.Header = a.errorHeader()
		}
		r.responded(msg.RespondMsg(out), a)
	}, &res, &err)
	return res, err
}

// Wait blocks until every request handed to a Handler or a MicroHandler has been
// answered. Unsubscribe (or stop the service) first.
func (r *Replier) Wait() {
	if r != nil {
		r.a.running.Wait()
	}
}

// errNoReplier is the error reply to a request handed to a nil *Replier.
const errNoReplier = "dedup: the service has no replier"

// Stats returns what the Replier has answered so far.
func (r *Replier) Stats() ReplyStats {
	if r == nil {
		return ReplyStats{}
	}
	var s ReplyStats
	for i := range s.replies {
		s.replies[i] = r.replies[i].Load()
	}
	s.RespondErrors = r.respErr.Load()
	s.NoReplySubject = r.noReply.Load()
	return s
}

// answer is what a request is answered with: a reply, or an error reply (code set).
type answer struct {
	kind       ReplyKind
	reply      Reply // the reply, or an error reply's data
	code, desc string
	retryAfter time.Duration // for an IN PROGRESS elsewhere
}

// errorHeader is an error reply's header, micro's.
func (a answer) errorHeader() natsgo.Header {
	h := natsgo.Header{micro.ErrorHeader: {a.desc}, micro.ErrorCodeHeader: {a.code}}
	if a.retryAfter > 0 {
		h[RetryAfterHeader] = []string{strconv.FormatInt(a.retryAfter.Milliseconds(), 10)}
	}
	return h
}

// serve runs fn for m through the handler and answers with respond, once, whatever
// happens (fn's runtime.Goexit included: then a 500). The result goes to *res, *err.
func (r *Replier) serve(ctx context.Context, m *Msg, fn ReplyFunc, respond func(answer), res *dedup.ItemResult, err *error) {
	if fn == nil || ctx == nil {
		r.a.cfg.logger.Error("dedup: request not run", "handler", r.a.h.Name(), "err", ErrBadInput)
		*err = ErrBadInput
		respond(answer{kind: ReplyError, code: CodeFailed, desc: "dedup: the service was given no handler"})
		return
	}
	var first Reply // fn's reply, as it returned it: the first request needs no decoding
	returned := false
	defer func() {
		if !returned { // fn ended its goroutine (runtime.Goexit): answered as a panic
			respond(answer{kind: ReplyError, code: CodeFailed, desc: DescPanicked})
		}
	}()
	item := []dedup.Item{{Key: r.a.cfg.strategy.Key(m), Payload: m.data}}
	*res = r.a.h.Run(ctx, item, func(ctx context.Context, _ int) error {
		rep, ferr := fn(ctx, m)
		if ferr != nil {
			return ferr
		}
		first = rep
		return dedup.SetReply(ctx, encodeReply(rep))
	})[0]
	*err = res.Err
	returned = true
	respond(r.answerFor(*res, *err, first))
}

// answerFor maps a result to its answer (see Replier).
func (r *Replier) answerFor(res dedup.ItemResult, err error, first Reply) answer {
	switch res.Outcome {
	case dedup.Processed, dedup.NotRecorded, dedup.LeaseLost:
		if res.HasReply { // fn's, in hand (too large to store, or not recorded, or not)
			return answer{kind: ReplyRun, reply: first}
		}
	case dedup.Duplicate:
		if !res.HasReply {
			return answer{kind: ReplyNotStored, code: CodeNotStored, desc: DescNotStored}
		}
		rep, derr := decodeReply(res.Reply)
		if derr != nil {
			r.a.cfg.logger.Warn("dedup: stored reply unreadable", "handler", r.a.h.Name(), "reply_bytes", len(res.Reply))
			return answer{kind: ReplyError, code: CodeFailed, desc: DescUnreadable}
		}
		return answer{kind: ReplyStored, reply: rep}
	case dedup.InProgress:
		wait := min(max(res.RetryAfter, time.Millisecond), r.a.cfg.retryAfter)
		return answer{kind: ReplyRetry, code: CodeRetry, desc: DescInProgress, retryAfter: wait}
	case dedup.StoreUnavailable:
		return answer{kind: ReplyRetry, code: CodeRetry, desc: DescStoreUnavailable}
	case dedup.Failed:
		var se *ServiceError
		if errors.As(err, &se) && se.Code != "" && se.Description != "" {
			return answer{kind: ReplyError, code: se.Code, desc: se.Description, reply: Reply{Data: se.Data}}
		}
		return answer{kind: ReplyError, code: CodeFailed, desc: DescFailed}
	case dedup.Panicked:
		return answer{kind: ReplyError, code: CodeFailed, desc: DescPanicked}
	case dedup.NoKey:
		return answer{kind: ReplyRejected, code: CodeNoKey, desc: DescNoKey}
	case dedup.KeyReuse:
		return answer{kind: ReplyRejected, code: CodeKeyReuse, desc: DescKeyReuse}
	case dedup.Cancelled:
		return answer{kind: ReplyRetry, code: CodeRetry, desc: DescShuttingDown}
	}
	// a lease lost while fn ran (another owner may run it now), or no result: not now
	return answer{kind: ReplyRetry, code: CodeRetry, desc: DescNotCompleted}
}

// responded counts an answer sent (rerr: the connection's error).
func (r *Replier) responded(rerr error, a answer) {
	if rerr != nil {
		r.respErr.Add(1)
		r.a.cfg.logger.Warn("dedup: reply not sent", "handler", r.a.h.Name(), "kind", a.kind.String(), "err", rerr)
		return
	}
	r.replies[a.kind].Add(1)
}

// MicroHandler returns a micro.Handler for a nats.go/micro endpoint that answers
// each request as Handler does:
//
//	svc.AddEndpoint("create", orders.MicroHandler(ctx, createOrder))
//
// Replies go through micro's Request (Respond, or Error for error replies), so
// the service's stats count them, a stored reply as a success. ctx is the
// requests' parent.
func (r *Replier) MicroHandler(ctx context.Context, fn ReplyFunc) micro.Handler {
	if r == nil {
		return micro.HandlerFunc(func(req micro.Request) {
			slog.Default().Error("dedup: request handed to a nil *Replier (did NewReplier fail?)")
			if !isNil(req) {
				_ = req.Error(CodeFailed, errNoReplier, nil)
			}
		})
	}
	if ctx != nil {
		ctx = dedup.WaitForRunning(ctx)
	}
	return micro.HandlerFunc(func(req micro.Request) {
		if isNil(req) {
			r.a.cfg.logger.Error("dedup: nil request handed to the handler; dropped", "handler", r.a.h.Name())
			return
		}
		r.a.running.Add(1)
		done := make(chan struct{})
		// waited for, not inline: an fn's runtime.Goexit must not end micro's goroutine
		go func() {
			defer r.a.recovered()
			defer close(done)
			defer r.a.running.Done()
			m := &Msg{subject: req.Subject(), header: natsgo.Header(req.Headers()), data: req.Data()}
			var res dedup.ItemResult
			var err error
			r.serve(ctx, m, fn, func(a answer) {
				if a.code != "" {
					var extra []micro.RespondOpt
					if a.retryAfter > 0 {
						extra = append(extra, micro.WithHeaders(micro.Headers{
							RetryAfterHeader: {strconv.FormatInt(a.retryAfter.Milliseconds(), 10)}}))
					}
					r.responded(req.Error(a.code, a.desc, a.reply.Data, extra...), a)
					return
				}
				r.responded(req.Respond(a.reply.Data, micro.WithHeaders(micro.Headers(a.reply.Header))), a)
			}, &res, &err)
		}()
		<-done
	})
}
