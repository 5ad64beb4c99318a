package dedup

import (
	"context"
	"errors"
	"sync"
	"time"
)

// fakeDB is a database for the transactional marker's core tests: committed markers
// and committed effects (a business table of message keys), transactions that hold
// the markers they write until they end (a second Begin of one waits, as on a
// unique index), savepoints, and injected failures. Expiry is on its own clock, the
// real one: it is the database's, never the caller's.
type fakeDB struct {
	mu      sync.Mutex
	changed *sync.Cond
	markers map[[32]byte]fakeMarker
	held    map[[32]byte]*fakeTx // markers written by open transactions
	effects map[string]int       // committed effects, by key

	begins, commits, rollbacks, savepoints int
	waiters                                int // Begins waiting at a marker another transaction holds

	failBegin  error // Begin fails with it
	failCommit error // Commit fails with it, rolled back
	// unknownCommit: Commit loses its connection, after the commit (applied) or
	// before it (not applied): the error wraps ErrCommitUnknown
	unknownCommit bool
	unknownApply  bool
}

type fakeMarker struct {
	owner, fp string
	expires   time.Time
}

type fakeTx struct {
	db      *fakeDB
	markers map[[32]byte]Marker
	effects []string
	save    int      // len(effects) at the last savepoint
	saved   []string // its effects, to give back
	done    bool
}

func newFakeDB() *fakeDB {
	db := &fakeDB{markers: map[[32]byte]fakeMarker{}, held: map[[32]byte]*fakeTx{}, effects: map[string]int{}}
	db.changed = sync.NewCond(&db.mu)
	return db
}

var _ Transactor[*fakeTx] = (*fakeDB)(nil)

func (db *fakeDB) Begin(ctx context.Context, markers []Marker) (*fakeTx, []MarkerState, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.begins++
	if db.failBegin != nil {
		return nil, nil, db.failBegin
	}
	tx := &fakeTx{db: db, markers: map[[32]byte]Marker{}}
	stop := context.AfterFunc(ctx, func() {
		db.mu.Lock()
		db.changed.Broadcast()
		db.mu.Unlock()
	})
	defer stop()
	found := make([]MarkerState, len(markers))
	for i, m := range markers {
		for db.held[m.Digest] != nil && db.held[m.Digest] != tx { // a row lock: wait
			if ctx.Err() != nil {
				tx.release()
				return nil, nil, ctx.Err()
			}
			db.waiters++
			db.changed.Wait()
			db.waiters--
		}
		if old, ok := db.markers[m.Digest]; ok && time.Now().Before(old.expires) {
			found[i] = MarkerState{Found: true, Fingerprint: old.fp}
			continue
		}
		db.held[m.Digest] = tx
		tx.markers[m.Digest] = m
	}
	return tx, found, nil
}

// release gives up tx's held markers; db.mu is held.
func (tx *fakeTx) release() {
	for d := range tx.markers {
		if tx.db.held[d] == tx {
			delete(tx.db.held, d)
		}
	}
	tx.done = true
	tx.db.changed.Broadcast()
}

// write is fn's effect: a row of the business table, in tx.
func (tx *fakeTx) write(key string) { tx.effects = append(tx.effects, key) }

func (db *fakeDB) Savepoint(ctx context.Context, tx *fakeTx) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.savepoints++
	tx.save = len(tx.effects)
	return nil
}

func (db *fakeDB) RollbackTo(ctx context.Context, tx *fakeTx, m Marker) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	tx.effects = tx.effects[:tx.save]
	if _, ok := tx.markers[m.Digest]; ok && m.Owner == tx.markers[m.Digest].Owner {
		delete(tx.markers, m.Digest)
		delete(db.held, m.Digest)
		db.changed.Broadcast()
	}
	return nil
}

func (db *fakeDB) Commit(ctx context.Context, tx *fakeTx) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.commits++
	defer tx.release()
	if db.failCommit != nil {
		return db.failCommit
	}
	if db.unknownCommit && !db.unknownApply {
		return errors.Join(ErrCommitUnknown, errors.New("fake: connection lost before COMMIT reached the server"))
	}
	for d, m := range tx.markers {
		db.markers[d] = fakeMarker{owner: m.Owner, fp: m.Fingerprint, expires: time.Now().Add(m.Retention)}
	}
	for _, k := range tx.effects {
		db.effects[k]++
	}
	if db.unknownCommit {
		return errors.Join(ErrCommitUnknown, errors.New("fake: connection lost after COMMIT"))
	}
	return nil
}

func (db *fakeDB) Rollback(ctx context.Context, tx *fakeTx) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if tx.done {
		panic("fake: a transaction ended twice")
	}
	db.rollbacks++
	tx.release()
	return nil
}

// effectsOf returns how many committed effects key has.
func (db *fakeDB) effectsOf(key string) int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.effects[key]
}

// markerOf reports whether h's record of key has a committed marker.
func (db *fakeDB) markerOf(h *Handler, key string) bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	_, ok := db.markers[RecordDigest(h.RecordKey(key))]
	return ok
}

// openTxs counts transactions holding markers.
func (db *fakeDB) openTxs() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	txs := map[*fakeTx]bool{}
	for _, tx := range db.held {
		txs[tx] = true
	}
	return len(txs)
}

func (db *fakeDB) set(f func(db *fakeDB)) {
	db.mu.Lock()
	defer db.mu.Unlock()
	f(db)
}

func (db *fakeDB) counts() (begins, commits, rollbacks, savepoints int) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.begins, db.commits, db.rollbacks, db.savepoints
}

// waiting returns how many Begins wait at a marker another transaction holds.
func (db *fakeDB) waiting() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.waiters
}
