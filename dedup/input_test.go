package dedup

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/keys"
)

// nilMsg is a keys.Message held as a nil pointer: its methods panic.
type nilMsg struct{ h map[string]string }

func (m *nilMsg) Header(name string) string { return m.h[name] }
func (m *nilMsg) Data() []byte              { return []byte(m.h["body"]) }

// Bad input to every entry point is an error wrapping ErrInvalidOption, never a
// panic, and runs nothing.
func TestBadInputIsAnErrorAtEveryEntryPoint(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	d := newDeduper(t, mem)
	h := register(t, d, "orders")
	replies := register(t, d, "replies", WithReplies(0))
	var none *Handler
	var nilCtx context.Context
	ctx := context.Background()
	ran := 0
	fn := func(context.Context) error { ran++; return nil }
	rfn := func(context.Context) ([]byte, error) { ran++; return nil, nil }
	bfn := func(context.Context, int) error { ran++; return nil }
	db := newFakeDB()
	tfn := func(context.Context, *fakeTx) error { ran++; return nil }
	var nilDB *fakeDB
	msg := keys.Raw{Headers: map[string]string{"Idempotency-Key": "k"}}
	items := []Item{{Key: "a"}, {Key: "b"}}

	calls := map[string]func() error{
		"Do, nil fn":             func() error { _, err := h.Do(ctx, "k", nil); return err },
		"Do, nil ctx":            func() error { _, err := h.Do(nilCtx, "k", fn); return err },
		"Do, nil handler":        func() error { _, err := none.Do(ctx, "k", fn); return err },
		"Run on replies, nil fn": func() error { return batchErr(replies.Run(ctx, items[:1], nil)) },
		"SetReply outside a run": func() error { return SetReply(ctx, []byte("x")) },
		"SetReply, nil ctx":      func() error { return SetReply(nilCtx, []byte("x")) },
		"Do on replies":          func() error { _, err := replies.Do(ctx, "k", fn); return err },
		"HandleReply, nil msg":   func() error { _, err := runReplyMsg(replies, ctx, nil, rfn); return err },
		"HandleKeyReply, nil ctx": func() error {
			_, err := runReply(replies, nilCtx, "k", nil, rfn)
			return err
		},
		"Mark, nil ctx":           func() error { _, err := h.Mark(nilCtx, "k"); return err },
		"Do, WaitForRunning(nil)": func() error { _, err := h.Do(WaitForRunning(nilCtx), "k", fn); return err },
		"Run, WhenChecked(nil)": func() error {
			return batchErr(h.Run(WhenChecked(nilCtx, func() {}), items, bfn))
		},
		"Mark, nil handler":     func() error { _, err := none.Mark(ctx, "k"); return err },
		"Handle, nil msg":       func() error { _, err := h.Handle(ctx, nil, fn); return err },
		"Handle, typed nil msg": func() error { _, err := h.Handle(ctx, (*nilMsg)(nil), fn); return err },
		"Handle, nil fn":        func() error { _, err := h.Handle(ctx, msg, nil); return err },
		"HandleKey, nil fn":     func() error { _, err := handleKey(h, ctx, "k", nil, nil); return err },
		"DoTx, nil transactor":  func() error { _, err := DoTx[*fakeTx](ctx, h, "k", nil, tfn); return err },
		"DoTx on replies":       func() error { _, err := DoTx[*fakeTx](ctx, replies, "k", db, tfn); return err },
		"RunTx on replies": func() error {
			return batchErr(RunTx[*fakeTx](ctx, replies, items, db, func(context.Context, *fakeTx, int) error { ran++; return nil }))
		},
		"DoTx, typed nil":            func() error { _, err := DoTx[*fakeTx](ctx, h, "k", nilDB, tfn); return err },
		"DoTx, nil fn":               func() error { _, err := DoTx[*fakeTx](ctx, h, "k", db, nil); return err },
		"DoTx, nil handler":          func() error { _, err := DoTx[*fakeTx](ctx, none, "k", db, tfn); return err },
		"handleTx, nil msg":          func() error { _, err := handleTx[*fakeTx](ctx, h, nil, db, tfn); return err },
		"handleKeyTx, nil ctx":       func() error { _, err := handleKeyTx[*fakeTx](nilCtx, h, "k", nil, db, tfn); return err },
		"Lookup, nil ctx":            func() error { _, err := h.Lookup(nilCtx, "k"); return err },
		"LookupMany, nil handler":    func() error { _, err := none.LookupMany(ctx, []string{"k"}); return err },
		"Forget, nil ctx":            func() error { _, err := h.Forget(nilCtx, "k"); return err },
		"Subscribers, nil ctx":       func() error { _, err := h.Subscribers(nilCtx); return err },
		"CountRecords, nil ctx":      func() error { _, err := d.CountRecords(nilCtx, ""); return err },
		"Register, nil option":       func() error { _, err := d.Register("x", nil); return err },
		"Register, nil Deduper":      func() error { _, err := (*Deduper)(nil).Register("x"); return err },
		"New, nil option":            func() error { _, err := New(mem, nil); return err },
		"New, nil store":             func() error { _, err := New(nil); return err },
		"New, typed nil store":       func() error { var s *memstore.Store; _, err := New(s); return err },
		"NewRedisStore, nil client":  func() error { _, err := redisstore.New(nil); return err },
		"NewMemoryStore, nil option": func() error { _, err := memstore.New(nil); return err },
		"redisstore.New, typed nil client": func() error {
			var c *redis.Client
			_, err := redisstore.New(c)
			return err
		},
		"Do, a zero Handler":       func() error { _, err := (&Handler{}).Do(ctx, "k", fn); return err },
		"Register, a zero Deduper": func() error { _, err := (&Deduper{}).Register("x"); return err },
		"HandleBatch, nil fn":      func() error { return batchErr(h.Run(ctx, items, nil)) },
		"HandleBatchParallel, nil ctx": func() error {
			return batchErr(h.Run(nilCtx, items, bfn, Parallel(2)))
		},
		"Run on replies, nil fn, Parallel": func() error { return batchErr(replies.Run(ctx, items, nil, Parallel(2))) },
		"Run, Parallel(0)":                 func() error { return batchErr(h.Run(ctx, items, bfn, Parallel(0))) },
		"Run, nil RunOption":               func() error { return batchErr(h.Run(ctx, items, bfn, nil)) },
		"RunTx, Parallel(2)": func() error {
			return batchErr(RunTx[*fakeTx](ctx, h, items, db, func(context.Context, *fakeTx, int) error { return nil }, Parallel(2)))
		},
		"HandleBatchTx, nil transactor": func() error {
			return batchErr(RunTx[*fakeTx](ctx, h, items, nil, func(context.Context, *fakeTx, int) error { return nil }, nil))
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panicked: %v", r)
					}
				}()
				err = call()
			}()
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("error %v, want one wrapping ErrInvalidOption", err)
			}
		})
	}
	if ran != 0 {
		t.Fatalf("%d functions ran on bad input", ran)
	}
	if rep := (*Deduper)(nil).Health(nilCtx); rep.Status != driver.HealthFail {
		t.Fatalf("Health of a nil Deduper: %v", rep.Status)
	}
	if err := (*Deduper)(nil).Close(); err != nil {
		t.Fatal(err)
	}
	// the accessors of a nil Handler or Deduper answer zero values
	if none.Name() != "" || none.Retention() != 0 || none.ReplyLimit() != 0 ||
		none.RecordKey("k") != "" || none.Stats() != (Stats{}) || none.Mode() != ModeDo {
		t.Fatal("a nil Handler's accessors")
	}
	if s, _ := none.KeyStrategy(); s == nil {
		t.Fatal("a nil Handler's key strategy")
	}
	var nd *Deduper
	if nd.Breaker() || nd.Handlers() != nil || nd.Store() != nil {
		t.Fatal("a nil Deduper's accessors")
	}
	if rep := d.Health(nilCtx); rep.Status != driver.HealthOK {
		t.Fatalf("Health with a nil context: %+v", rep)
	}
}

// batchErr is the error every item of a batch refused as a whole carries.
func batchErr(rs []ItemResult) error {
	if len(rs) == 0 {
		return errors.New("no results")
	}
	for _, r := range rs {
		if !errors.Is(r.Err, ErrInvalidOption) {
			return r.Err
		}
	}
	return rs[0].Err
}
