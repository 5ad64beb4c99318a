package dedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// aclSetUser is the README's ACL line for a user that may run a redisstore.Store and nothing
// else: only keys and channels under <prefix>:, only the scripts (EVALSHA, and EVAL
// when the server has lost its script cache), the commands they call (GET, SET,
// PEXPIRE, PTTL, DEL, and PUBLISH for Forget's notices) and Mark's SET, and the
// Deduper's subscription to forget notices (SUBSCRIBE, and PING to tell it is
// alive). go-redis's connection handshake needs nothing more: HELLO and AUTH are open
// to every user, and a refused CLIENT SETINFO is ignored. The arguments are the user
// name, its password and the Deduper's prefix (twice).
const aclSetUser = "ACL SETUSER %s reset on >%s ~%[3]s:* &%[3]s:* +evalsha +eval +get +set +pexpire +pttl +del +publish +subscribe +ping"

// aclCommands are the commands aclSetUser allows; TestACLCommandsAreMinimal checks
// that the store needs each of them.
var aclCommands = []string{"evalsha", "eval", "get", "set", "pexpire", "pttl", "del", "publish", "subscribe", "ping"}

// aclServer is a redis-server of the test's own (ACL users are server-wide, so the
// shared server is left alone) and an admin client to it.
type aclServer struct {
	addr  string
	admin *redis.Client
}

func newACLServer(t *testing.T) aclServer {
	t.Helper()
	addr := spawnRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	return aclServer{addr: addr, admin: admin}
}

// setUser runs line (an "ACL SETUSER ..." command) as the admin.
func (s aclServer) setUser(t *testing.T, line string) {
	t.Helper()
	var args []any
	for _, f := range strings.Fields(line) {
		args = append(args, f)
	}
	if err := s.admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
}

// user returns a client logged in as name, and a redisstore.Store over it.
func (s aclServer) user(t *testing.T, name, password string) (*redis.Client, *redisstore.Store) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr, Username: name, Password: password, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

func isNoPerm(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "can't run this command"))
}

// Every conformance case passes for a user holding only the README's ACL line.
func TestEveryConformanceCasePassesAsTheACLUser(t *testing.T) {
	t.Parallel()
	srv := newACLServer(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		prefix, user := testenv.Prefix(), testenv.Prefix()
		srv.setUser(t, fmt.Sprintf(aclSetUser, user, "pw-"+user, prefix))
		_, st := srv.user(t, user, "pw-"+user)
		// The suite reads raw values through the admin client, so that only the
		// store's own commands run as the user.
		return storetest.Backend{Store: st, Prefix: prefix, Advance: time.Sleep, Raw: testenv.RedisRaw(srv.admin)}
	})
}

// storeFlow drives every Store operation, the batch forms and the EVAL fallback (the
// admin flushes the script cache first) on keys under prefix, and returns the first
// error.
func storeFlow(ctx context.Context, s driver.Store, admin *redis.Client, prefix string) error {
	k := func(n string) string { return prefix + ":orders:" + n }
	step := func(name string, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	wantStatus := func(name string, a driver.Answer, err error, want driver.Status) error {
		if err == nil && a.Status != want {
			err = fmt.Errorf("status %v, want %v", a.Status, want)
		}
		return step(name, err)
	}
	if err := admin.ScriptFlush(ctx).Err(); err != nil { // claims must fall back to EVAL
		return err
	}
	a, err := claim1(ctx, s, k("1"), "A", "fp", time.Minute)
	if err := wantStatus("claim", a, err, driver.StatusAcquired); err != nil {
		return err
	}
	a, err = claim1(ctx, s, k("1"), "B", "fp", time.Minute)
	if err := wantStatus("claim in progress", a, err, driver.StatusInProgress); err != nil {
		return err
	}
	if err := step("extend", extend1(ctx, s, k("1"), "A", time.Minute)); err != nil {
		return err
	}
	if err := step("complete", complete1(ctx, s, k("1"), "A", time.Hour)); err != nil {
		return err
	}
	a, err = claim1(ctx, s, k("1"), "B", "fp", time.Minute)
	if err := wantStatus("claim done", a, err, driver.StatusDuplicate); err != nil {
		return err
	}
	a, err = claim1(ctx, s, k("2"), "A", "", time.Minute)
	if err := wantStatus("claim 2", a, err, driver.StatusAcquired); err != nil {
		return err
	}
	if err := step("release", release1(ctx, s, k("2"), "A")); err != nil {
		return err
	}
	a, err = claim1(ctx, s, k("2"), "B", "", time.Minute)
	if err := wantStatus("claim released", a, err, driver.StatusAcquired); err != nil {
		return err
	}
	a, err = mark1(ctx, s, k("3"), "A", "", time.Hour)
	if err := wantStatus("mark", a, err, driver.StatusAcquired); err != nil {
		return err
	}
	claims, err := s.Claim(ctx, []driver.Entry{{Key: k("4"), Token: "A", TTL: time.Minute}, {Key: k("1"), Token: "C", Fingerprint: "fp", TTL: time.Minute}})
	if err == nil && (claims[0].Err != nil || claims[1].Err != nil) {
		err = errors.Join(claims[0].Err, claims[1].Err)
	}
	if err := step("claim many", err); err != nil {
		return err
	}
	errs, err := s.Complete(ctx, []driver.Entry{{Key: k("4"), Token: "A", TTL: time.Hour}})
	if err == nil {
		err = errs[0]
	}
	if err := step("complete many", err); err != nil {
		return err
	}
	marks, err := s.Mark(ctx, []driver.Entry{{Key: k("5"), Token: "A", TTL: time.Hour}, {Key: k("3"), Token: "B", TTL: time.Hour}})
	if err == nil && (marks[0].Err != nil || marks[1].Err != nil) {
		err = errors.Join(marks[0].Err, marks[1].Err)
	}
	if err == nil && (marks[0].Status != driver.StatusAcquired || marks[1].Status != driver.StatusDuplicate) {
		err = fmt.Errorf("statuses %v, %v", marks[0].Status, marks[1].Status)
	}
	if err := step("mark many", err); err != nil {
		return err
	}
	return recordsFlow(ctx, s, prefix, k)
}

// recordsFlow drives Lookup, Forget and the forget notices (subscribe, PING, a
// notice) on the DONE record k("1") of storeFlow, and returns the first error.
func recordsFlow(ctx context.Context, s driver.Store, prefix string, k func(string) string) error {
	rs := s.(driver.RecordStore)
	recs, err := rs.Lookup(ctx, []string{k("1")})
	if err == nil && recs[0].Err != nil {
		err = recs[0].Err
	}
	if err == nil && recs[0].State != driver.RecordDone {
		err = fmt.Errorf("state %v", recs[0].State)
	}
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	sub := s.(storekit.Notifier).ForgetNotices().Subscribe()
	defer sub.Close()
	next := func(want storekit.NoticeKind) error {
		for {
			n, err := sub.Receive(ctx, 2*time.Second)
			if err != nil || n.Kind == want {
				return err
			}
		}
	}
	if err := sub.Add(ctx, prefix+":orders"); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if err := next(storekit.Subscribed); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if err := sub.Ping(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if err := next(storekit.Heard); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	recs, err = rs.Forget(ctx, []string{k("1")}, false)
	if err == nil && recs[0].Err != nil {
		err = recs[0].Err
	}
	if err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	if err := next(storekit.Forgotten); err != nil {
		return fmt.Errorf("forget storekit.Notice: %w", err)
	}
	return nil
}

// The README's ACL line is enough for every store operation, and each command it
// allows is needed: without any one of them, some operation is refused.
func TestACLCommandsAreMinimal(t *testing.T) {
	t.Parallel()
	srv := newACLServer(t)
	ctx := context.Background()
	run := func(t *testing.T, cmds []string) error {
		prefix, user := testenv.Prefix(), testenv.Prefix()
		srv.setUser(t, fmt.Sprintf(aclSetUser, user, "pw", prefix))
		if cmds != nil { // narrow the user to cmds
			line := "ACL SETUSER " + user + " -@all"
			for _, c := range cmds {
				line += " +" + c
			}
			srv.setUser(t, line)
		}
		_, st := srv.user(t, user, "pw")
		return storeFlow(ctx, st, srv.admin, prefix)
	}
	if err := run(t, nil); err != nil {
		t.Fatalf("as the README's ACL user: %v", err)
	}
	for _, drop := range aclCommands {
		t.Run("without-"+drop, func(t *testing.T) {
			err := run(t, slices.DeleteFunc(slices.Clone(aclCommands), func(c string) bool { return c == drop }))
			if !isNoPerm(err) {
				t.Fatalf("the store works without %s (err %v): the ACL line is not minimal", drop, err)
			}
			t.Logf("without %s: %v", drop, err)
		})
	}
}

// A Deduper works end to end as the ACL user (Do, Mark, HandleBatch), and the user's
// store is refused, fail closed, on any key outside its prefix.
func TestDeduperWorksAsTheACLUserAndIsRefusedOutsideItsPrefix(t *testing.T) {
	t.Parallel()
	srv := newACLServer(t)
	ctx := context.Background()
	prefix, user := testenv.Prefix(), testenv.Prefix()
	srv.setUser(t, fmt.Sprintf(aclSetUser, user, "pw", prefix))
	uc, st := srv.user(t, user, "pw")

	d, err := New(st, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	orders, err := d.Register("orders")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := d.Register("metrics", WithMode(ModeFilter))
	if err != nil {
		t.Fatal(err)
	}
	res, err := orders.Do(ctx, "k1", ok)
	want(t, res, err, Processed)
	res, err = orders.Do(ctx, "k1", ok)
	want(t, res, err, Duplicate)
	res, err = metrics.Mark(ctx, "k1")
	want(t, res, err, First)
	res, err = metrics.Mark(ctx, "k1")
	want(t, res, err, Duplicate)
	items := []Item{{Key: "k1"}, {Key: "k2"}, {Key: "k3"}}
	for i, r := range orders.Run(ctx, items, func(context.Context, int) error { return nil }) {
		wantO := map[int]Outcome{0: Duplicate, 1: Processed, 2: Processed}[i]
		want(t, r.Result, r.Err, wantO)
	}
	// another instance (no local tier yet) sees the records in Redis
	d2, err := New(st, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	orders2, err := d2.Register("orders")
	if err != nil {
		t.Fatal(err)
	}
	res, err = orders2.Do(ctx, "k3", ok)
	want(t, res, err, Duplicate)

	// Outside the prefix: NOPERM, as a store error; the admin sees nothing written.
	other := testenv.Prefix() + ":orders:k1"
	if _, err := claim1(ctx, st, other, "A", "", time.Minute); !isNoPerm(err) || !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("claim outside the prefix: %v, want NOPERM as ErrStoreUnavailable", err)
	}
	if _, err := mark1(ctx, st, other, "A", "", time.Minute); !isNoPerm(err) {
		t.Fatalf("mark outside the prefix: %v", err)
	}
	if err := uc.Get(ctx, other).Err(); !isNoPerm(err) {
		t.Fatalf("GET outside the prefix: %v", err)
	}
	if err := uc.Keys(ctx, "*").Err(); !isNoPerm(err) {
		t.Fatalf("KEYS (not in the ACL line): %v", err)
	}
	if n := srv.admin.Exists(ctx, other).Val(); n != 0 {
		t.Fatal("a record was written outside the prefix")
	}
}

// Two tenants, each with its own prefix and ACL user, run the same handler on the
// same keys without interfering; tenant A's user is refused on tenant B's prefix (a
// Deduper misconfigured with B's prefix fails closed: fn does not run), and B's
// records stay untouched.
func TestTenantsWithTheirOwnACLUsersDoNotInterfere(t *testing.T) {
	t.Parallel()
	srv := newACLServer(t)
	ctx := context.Background()
	type tenant struct {
		prefix string
		store  *redisstore.Store
		h      *Handler
	}
	newTenant := func() tenant {
		prefix, user := testenv.Prefix(), testenv.Prefix()
		srv.setUser(t, fmt.Sprintf(aclSetUser, user, "pw", prefix))
		_, st := srv.user(t, user, "pw")
		d, err := New(st, WithPrefix(prefix), WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		h, err := d.Register("orders", WithLocalCache(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		return tenant{prefix, st, h}
	}
	a, b := newTenant(), newTenant()
	for _, tn := range []tenant{a, b} { // same handler, same key: each tenant runs it once
		res, err := tn.h.Do(ctx, "order-1", ok)
		want(t, res, err, Processed)
	}
	for _, tn := range []tenant{a, b} {
		res, err := tn.h.Do(ctx, "order-1", ok)
		want(t, res, err, Duplicate)
	}

	// A's credentials with B's prefix.
	wrong, err := New(a.store, WithPrefix(b.prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	h, err := wrong.Register("orders", WithLocalCache(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"order-1", "order-2"} {
		ran := false
		res, err := h.Do(ctx, key, func(context.Context) error { ran = true; return nil })
		want(t, res, err, StoreUnavailable)
		if ran || !isNoPerm(err) {
			t.Fatalf("%s with another tenant's prefix: ran %v, err %v; want NOPERM and fn not run", key, ran, err)
		}
	}
	if _, err := claim1(ctx, a.store, b.h.RecordKey("order-1"), "A", "", time.Minute); !isNoPerm(err) {
		t.Fatalf("tenant A's user on tenant B's record: %v", err)
	}
	if n := srv.admin.Exists(ctx, b.h.RecordKey("order-2")).Val(); n != 0 {
		t.Fatal("tenant A wrote under tenant B's prefix")
	}
	res, err := b.h.Do(ctx, "order-1", ok) // B's record is intact
	want(t, res, err, Duplicate)
}
