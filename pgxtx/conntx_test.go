package pgxtx_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/pgxtx"
)

// fixture is a Transactor on a table of its own, with a work table, on a pool
// whose statements a tracer counts.
type fixture struct {
	pool   *pgxpool.Pool
	tr     *pgxtx.Transactor
	work   string
	tracer *tracer
}

func newFixture(t *testing.T, opts ...pgxtx.Option) *fixture {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tc := &tracer{}
	cfg.ConnConfig.Tracer = tc
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		testenv.SkipNoServer(t, "PostgreSQL at DEDUP_POSTGRES_URL: %v", err)
	}
	t.Cleanup(pool.Close)
	table := testenv.TableName()
	tr, err := pgxtx.New(pool, append([]pgxtx.Option{pgxtx.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	work := table + "_w"
	t.Cleanup(func() {
		tr.Close()
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+work)
	})
	if err := tr.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+work+" (id INTEGER PRIMARY KEY, v TEXT)"); err != nil {
		t.Fatal(err)
	}
	return &fixture{pool: pool, tr: tr, work: work, tracer: tc}
}

func (f *fixture) begin(t *testing.T, key string) (pgx.Tx, dedup.Marker) {
	t.Helper()
	m := dedup.Marker{Handler: "h", Digest: dedup.RecordDigest(key), Owner: "owner-" + key, Retention: time.Hour}
	tx, found, err := f.tr.Begin(context.Background(), []dedup.Marker{m})
	if err != nil {
		t.Fatal(err)
	}
	if found[0].Found {
		t.Fatal("new marker found")
	}
	return tx, m
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// tracer counts the statements sent on their own and the batches.
type tracer struct {
	mu      sync.Mutex
	queries []string
	batches [][]string
	batch   []string
}

func (tc *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tc.mu.Lock()
	tc.queries = append(tc.queries, d.SQL)
	tc.mu.Unlock()
	return ctx
}
func (tc *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tc *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (tc *tracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tc.mu.Lock()
	tc.batch = append(tc.batch, d.SQL)
	tc.mu.Unlock()
}
func (tc *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	tc.mu.Lock()
	tc.batches = append(tc.batches, tc.batch)
	tc.batch = nil
	tc.mu.Unlock()
}
func (tc *tracer) reset() {
	tc.mu.Lock()
	tc.queries, tc.batches, tc.batch = nil, nil, nil
	tc.mu.Unlock()
}

// Begin sends BEGIN and the marker INSERT together: one batch, no statement on
// its own.
func TestBeginSendsBeginAndTheMarkerInOneRoundTrip(t *testing.T) {
	f := newFixture(t)
	tx, _ := f.begin(t, "warm-up") // the first Begin also makes the closed large objects
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.tracer.reset()
	tx, _ = f.begin(t, "k")
	defer tx.Rollback(context.Background())
	f.tracer.mu.Lock()
	defer f.tracer.mu.Unlock()
	if len(f.tracer.queries) != 0 || len(f.tracer.batches) != 1 || len(f.tracer.batches[0]) != 2 ||
		f.tracer.batches[0][0] != "begin" {
		t.Fatalf("Begin sent statements %q and batches %q, want one batch of begin and the insert",
			f.tracer.queries, f.tracer.batches)
	}
}

// The pgx.Tx Begin returns does what pgx's own does: every method runs in the
// transaction until it ends, every method fails with ErrTxClosed after, the
// connection goes back to the pool once.
func TestBeginsTxBehavesAsPgxsOwn(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tx, m := f.begin(t, "k")
	w := f.work
	if tx.Conn() == nil {
		t.Fatal("Conn is nil")
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+w+" VALUES (1, 'exec')"); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO "+w+" VALUES ($1, 'batch')", 2)
	b.Queue("INSERT INTO "+w+" VALUES ($1, 'batch')", 3)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := tx.CopyFrom(ctx, pgx.Identifier{w}, []string{"id", "v"}, pgx.CopyFromRows([][]any{{4, "copy"}, {5, "copy"}})); err != nil || n != 2 {
		t.Fatalf("CopyFrom: %d, %v", n, err)
	}
	if _, err := tx.Prepare(ctx, "dedup_test_ins", "INSERT INTO "+w+" VALUES ($1, 'prepared')"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "dedup_test_ins", 6); err != nil {
		t.Fatal(err)
	}
	// Nested: a rolled-back savepoint undoes its row, a committed one keeps it.
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Exec(ctx, "INSERT INTO "+w+" VALUES (7, 'undone')"); err != nil {
		t.Fatal(err)
	}
	inner, err := sp.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inner.Exec(ctx, "INSERT INTO "+w+" VALUES (8, 'undone')"); err != nil {
		t.Fatal(err)
	}
	if err := inner.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sp.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec on a rolled-back savepoint: %v", err)
	}
	sp2, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp2.Exec(ctx, "INSERT INTO "+w+" VALUES (9, 'kept')"); err != nil {
		t.Fatal(err)
	}
	if err := sp2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Large objects, in the transaction.
	lo := tx.LargeObjects()
	oid, err := lo.Create(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.pool.Exec(context.Background(), "SELECT lo_unlink($1)", oid) })
	obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite|pgx.LargeObjectModeRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obj.Write([]byte("large")); err != nil {
		t.Fatal(err)
	}
	if err := obj.Close(); err != nil {
		t.Fatal(err)
	}
	var got []int
	rows, err := tx.Query(ctx, "SELECT id FROM "+w+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 2, 3, 4, 5, 6, 9}; len(got) != len(want) || got[6] != 9 || got[5] != 6 {
		t.Fatalf("rows in the transaction: %v, want %v", got, want)
	}
	var v string
	if err := tx.QueryRow(ctx, "SELECT v FROM "+w+" WHERE id = 6").Scan(&v); err != nil || v != "prepared" {
		t.Fatalf("QueryRow: %q, %v", v, err)
	}
	if n := f.count(t, "SELECT count(*) FROM "+w); n != 0 {
		t.Fatalf("%d rows visible outside the transaction before its commit", n)
	}
	if err := f.tr.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n := f.pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections acquired after Commit", n)
	}
	if n := f.count(t, "SELECT count(*) FROM "+w); n != 7 {
		t.Fatalf("%d rows committed, want 7", n)
	}
	var data []byte
	if err := f.pool.QueryRow(ctx, "SELECT lo_get($1)", oid).Scan(&data); err != nil || !bytes.Equal(data, []byte("large")) {
		t.Fatalf("large object after commit: %q, %v", data, err)
	}
	if _, ok, _ := f.tr.Lookup(ctx, m.Handler, m.Digest); !ok {
		t.Fatal("marker not committed")
	}

	// Ended: every method fails with ErrTxClosed, and nothing is released twice.
	closed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s after Commit: %v, want ErrTxClosed", what, err)
		}
	}
	_, err = tx.Exec(ctx, "SELECT 1")
	closed("Exec", err)
	rows, err = tx.Query(ctx, "SELECT 1")
	closed("Query", err)
	closed("Query's rows", rows.Err())
	closed("QueryRow", tx.QueryRow(ctx, "SELECT 1").Scan(&v))
	_, err = tx.SendBatch(ctx, &pgx.Batch{}).Exec()
	closed("SendBatch", err)
	_, err = tx.CopyFrom(ctx, pgx.Identifier{w}, []string{"id"}, pgx.CopyFromRows(nil))
	closed("CopyFrom", err)
	_, err = tx.Prepare(ctx, "x", "SELECT 1")
	closed("Prepare", err)
	_, err = tx.Begin(ctx)
	closed("Begin", err)
	closedLO := tx.LargeObjects()
	_, err = closedLO.Create(ctx, 0)
	closed("LargeObjects().Create", err)
	_, err = obj.Read(make([]byte, 1))
	closed("a large object's Read", err)
	closed("Commit", tx.Commit(ctx))
	closed("Rollback", tx.Rollback(ctx))
	if err := f.tr.Rollback(ctx, tx); err != nil {
		t.Fatalf("Transactor.Rollback after Commit: %v", err)
	}
	if n := f.pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections acquired", n)
	}
}

// A COMMIT of a transaction a failed statement aborted is answered ROLLBACK: a
// known failure, as pgx reports it.
func TestCommitOfAnAbortedTxIsAKnownFailure(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tx, m := f.begin(t, "k")
	if _, err := tx.Exec(ctx, "SELECT no_such_column FROM "+f.work); err == nil {
		t.Fatal("bad statement succeeded")
	}
	err := f.tr.Commit(ctx, tx)
	if !errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, dedup.ErrCommitUnknown) {
		t.Fatalf("Commit of an aborted transaction: %v, want ErrTxCommitRollback and not ErrCommitUnknown", err)
	}
	if _, ok, _ := f.tr.Lookup(ctx, m.Handler, m.Digest); ok {
		t.Fatal("marker committed")
	}
	if n := f.pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections acquired", n)
	}
	// Its first LargeObjects comes after the end: it must not reach the connection,
	// which is back in the pool.
	lo := tx.LargeObjects()
	if _, err := lo.Create(ctx, 0); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("LargeObjects after the end: %v, want ErrTxClosed", err)
	}
}

// WithTxOptions reaches the BEGIN that Begin batches with the insert.
func TestTxOptionsReachBegin(t *testing.T) {
	f := newFixture(t, pgxtx.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable, DeferrableMode: pgx.NotDeferrable}))
	tx, _ := f.begin(t, "k")
	defer f.tr.Rollback(context.Background(), tx)
	var iso string
	if err := tx.QueryRow(context.Background(), "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "serializable" {
		t.Fatalf("isolation %q (%v), want serializable", iso, err)
	}
}
