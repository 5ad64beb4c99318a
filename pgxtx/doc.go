// Package pgxtx runs dedup's transactional handlers on PostgreSQL through pgx's
// native pool (github.com/jackc/pgx/v5/pgxpool). It implements dedup.Transactor for
// pgx.Tx (docs/design.md §9), with the marker table, statements and semantics of package
// sqltx's PostgreSQL dialect (both use internal/markersql): a run's marker row is
// written in the transaction its fn writes in, so that "processed" commits or rolls
// back with the effect.
//
// The table holds, per handler and record, the SHA-256 digest of the record key
// (never the key), the payload fingerprint, the run's owner token and an expiry, all
// expiries written and compared by the database's clock (now()). Schema returns its
// CREATE statements; Migrate runs them. Sweep deletes expired markers in bounded
// batches; WithSweep runs it on a goroutine until Close.
//
// A Commit whose COMMIT may have reached the server (written, and the connection
// lost before the answer) returns an error wrapping dedup.ErrCommitUnknown; any
// other Commit error means the transaction was rolled back, a COMMIT pgx never sent
// included (the connection closed already, or its write failed with nothing
// written). Effects outside the transaction are not covered.
package pgxtx
