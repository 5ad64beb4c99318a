// Package pgxtx runs dedup's transactional handlers on PostgreSQL through pgx's
// native pool (github.com/jackc/pgx/v5/pgxpool): [Transactor] implements
// dedup.Transactor for pgx.Tx (docs/design.md §9), with the marker table,
// statements and semantics of package sqltx's PostgreSQL dialect. A run's marker
// row is written in the transaction its fn writes in, so that "processed"
// commits or rolls back with the effect. Effects outside the transaction are not
// covered.
//
// The table holds, per handler and record, the SHA-256 of the record key (never
// the key), the payload fingerprint, the run's owner token and an expiry, by the
// database's clock. [Transactor.Schema] returns its CREATE statements and
// [Transactor.Migrate] runs them; [Transactor.Sweep], or [WithSweep], deletes
// expired markers.
//
// A Commit whose COMMIT may have reached the server returns an error wrapping
// dedup.ErrCommitUnknown; any other Commit error means the transaction was
// rolled back.
package pgxtx
