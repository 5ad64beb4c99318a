package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// Secrets the logs must never hold: a key in each of keys.Normalize's forms (plain,
// and hashed), and payloads.
const (
	secretPlainKey = "SECRET-KEY-7f3a9c"
	secretPayloadA = "SECRET-PAYLOAD-A-41d2"
	secretPayloadB = "SECRET-PAYLOAD-B-93e7"
)

var secretHashedKey = "SECRET key, hashed: " + strings.Repeat("é", 40)

// Every log line of the package, driven with recognisable keys and payloads, names
// the key by its hash only: no line holds the key, its normalised form, its record
// key or a payload (not even the payload in a panic's value or an error).
func TestLogsHoldNoKeyOrPayload(t *testing.T) {
	unavailable := fmt.Errorf("%w: injected", ErrStoreUnavailable)
	failOn := func(ops map[string]error) func(*hookStore) {
		return func(s *hookStore) { s.onFail(func(op string) error { return ops[op] }) }
	}
	untilDone := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	type scenario struct {
		name  string
		opts  []HandlerOption
		setup func(*hookStore) // before the run
		run   func(ctx context.Context, h *Handler, key string) error
		want  string // a message that must be logged
	}
	doWith := func(fn func(context.Context) error) func(context.Context, *Handler, string) error {
		return func(ctx context.Context, h *Handler, key string) error {
			_, err := handleKey(h, ctx, key, []byte(secretPayloadA), fn)
			return err
		}
	}
	reuse := func(ctx context.Context, h *Handler, key string) error {
		if _, err := handleKey(h, ctx, key, []byte(secretPayloadA), ok); err != nil {
			return err
		}
		res, err := handleKey(h, ctx, key, []byte(secretPayloadB), ok)
		if res.Outcome != KeyReuse {
			return fmt.Errorf("outcome %v (%v), want KeyReuse", res.Outcome, err)
		}
		return nil
	}
	batch := func(ctx context.Context, h *Handler, key string) error {
		// two items: a batch of one is a single call
		h.Run(ctx, []Item{{Key: key, Payload: []byte(secretPayloadA)}, {Key: key + "-2", Payload: []byte(secretPayloadA)}}, func(context.Context, int) error { return nil })
		return nil
	}
	batchReuse := func(ctx context.Context, h *Handler, key string) error {
		if _, err := handleKey(h, ctx, key, []byte(secretPayloadA), ok); err != nil {
			return err
		}
		r := h.Run(ctx, []Item{{Key: key, Payload: []byte(secretPayloadB)}}, func(context.Context, int) error { return nil }, asBatch)
		if r[0].Outcome != KeyReuse {
			return fmt.Errorf("outcome %v, want KeyReuse", r[0].Outcome)
		}
		return nil
	}
	scenarios := []scenario{
		{name: "key reuse (claim)", opts: []HandlerOption{WithFingerprint(true)}, run: reuse, want: "key reused"},
		{name: "key reuse (mark)", opts: []HandlerOption{WithFingerprint(true), WithMode(ModeFilter)}, run: reuse, want: "key reused"},
		{name: "key reuse (batch)", opts: []HandlerOption{WithFingerprint(true)}, run: batchReuse, want: "key reused"},
		{name: "fail open", opts: []HandlerOption{WithStoreFailure(FailOpen)}, setup: failOn(map[string]error{"claim": unavailable}),
			run: doWith(ok), want: "running without dedup"},
		{name: "fail closed", setup: failOn(map[string]error{"claim": unavailable}), run: doWith(ok), want: "failing closed"},
		{name: "fail open (batch)", opts: []HandlerOption{WithStoreFailure(FailOpen)}, setup: failOn(map[string]error{"claim-many": unavailable}),
			run: batch, want: "running without dedup"},
		{name: "fail closed (batch)", setup: failOn(map[string]error{"claim-many": unavailable}), run: batch, want: "failing closed"},
		{name: "panic", run: doWith(func(context.Context) error { panic("boom: " + secretPayloadA) }), want: "handler panicked"},
		{name: "lease lost at completion", setup: failOn(map[string]error{"complete": ErrLeaseLost}), run: doWith(ok), want: "lease lost before completion"},
		{name: "not recorded", setup: failOn(map[string]error{"complete": unavailable}), run: doWith(ok), want: "DONE not written"},
		{name: "extension failed", opts: []HandlerOption{WithLease(minLease)}, setup: failOn(map[string]error{"extend": unavailable}),
			run: doWith(untilDone), want: "lease extension failed"},
		{name: "release failed", setup: failOn(map[string]error{"release": unavailable}),
			run: doWith(func(context.Context) error { return errors.New("fn failed") }), want: "release failed"},
	}
	for _, key := range []string{secretPlainKey, secretHashedKey} {
		for _, sc := range scenarios {
			t.Run(fmt.Sprintf("%s/%s", sc.name, map[bool]string{true: "plain", false: "hashed"}[key == secretPlainKey]), func(t *testing.T) {
				mem, _ := memstore.New()
				store := &hookStore{Store: mem}
				logs := &testenv.LogBuffer{}
				d, err := New(store, WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
				if err != nil {
					t.Fatal(err)
				}
				h, err := d.Register("orders", sc.opts...)
				if err != nil {
					t.Fatal(err)
				}
				if sc.setup != nil {
					sc.setup(store)
				}
				if err := sc.run(context.Background(), h, key); err != nil && !strings.Contains(sc.name, "panic") {
					t.Logf("run: %v", err) // outcomes are checked elsewhere; the logs are checked here
				}
				d.Close() // background releases have logged
				out := logs.String()
				if !strings.Contains(out, sc.want) {
					t.Fatalf("no %q line in the logs:\n%s", sc.want, out)
				}
				if !strings.Contains(out, `"key_hash":`) && sc.want != "lease extension failed" {
					t.Fatalf("the lines name no key hash:\n%s", out)
				}
				for _, secret := range []string{key, keys.Normalize(key), h.RecordKey(key), secretPayloadA, secretPayloadB} {
					if strings.Contains(out, secret) {
						t.Fatalf("a log line holds %q:\n%s", secret, out)
					}
				}
			})
		}
	}
}

// Replies are opaque and never logged: every log line the stored replies' paths
// write (a reply too large, a completion with a reply that failed or found its lease
// lost, a fail-open run, in the single and the batch forms) holds neither the reply
// nor the key.
func TestLogsHoldNoReply(t *testing.T) {
	const secretReply = "SECRET-REPLY-5be1c0"
	unavailable := fmt.Errorf("%w: injected", ErrStoreUnavailable)
	reply := func(n int) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return []byte(secretReply + strings.Repeat("x", n)), nil }
	}
	for _, sc := range []struct {
		name string
		fail map[string]error
		opts []HandlerOption
		run  func(ctx context.Context, h *Handler, key string)
		want string
	}{
		{"too large", nil, nil, func(ctx context.Context, h *Handler, key string) { runReply(h, ctx, key, nil, reply(64)) }, "reply too large"},
		{"too large (batch)", nil, nil, func(ctx context.Context, h *Handler, key string) {
			h.Run(ctx, []Item{{Key: key}, {Key: key + "-2"}}, replyingEach(func(ctx context.Context, _ int) ([]byte, error) { return reply(64)(ctx) }), Parallel(1))
		}, "reply too large"},
		{"not recorded", map[string]error{"complete-reply": unavailable}, nil,
			func(ctx context.Context, h *Handler, key string) { runReply(h, ctx, key, nil, reply(0)) }, "DONE not written"},
		{"lease lost", map[string]error{"complete-reply": ErrLeaseLost}, nil,
			func(ctx context.Context, h *Handler, key string) { runReply(h, ctx, key, nil, reply(0)) }, "lease lost before completion"},
		{"not recorded (batch)", map[string]error{"complete-many": unavailable, "complete-reply": unavailable}, nil, func(ctx context.Context, h *Handler, key string) {
			// two items, completed as their fns return: one or two calls
			h.Run(ctx, []Item{{Key: key}, {Key: key + "-2"}}, replyingEach(func(ctx context.Context, _ int) ([]byte, error) { return reply(0)(ctx) }), Parallel(1))
		}, "DONE not written"},
		{"fail open", map[string]error{"claim": unavailable}, []HandlerOption{WithStoreFailure(FailOpen)},
			func(ctx context.Context, h *Handler, key string) { runReply(h, ctx, key, nil, reply(0)) }, "running without dedup"},
	} {
		t.Run(sc.name, func(t *testing.T) {
			mem, _ := memstore.New()
			store := &hookStore{Store: mem}
			logs := &testenv.LogBuffer{}
			d, err := New(store, WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
			if err != nil {
				t.Fatal(err)
			}
			h, err := d.Register("orders", append([]HandlerOption{WithReplies(len(secretReply) + 8)}, sc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			store.onFail(func(op string) error { return sc.fail[op] })
			sc.run(context.Background(), h, secretPlainKey)
			d.Close()
			out := logs.String()
			if !strings.Contains(out, sc.want) {
				t.Fatalf("no %q line in the logs:\n%s", sc.want, out)
			}
			for _, secret := range []string{secretReply, secretPlainKey} {
				if strings.Contains(out, secret) {
					t.Fatalf("a log line holds %q:\n%s", secret, out)
				}
			}
		})
	}
}
