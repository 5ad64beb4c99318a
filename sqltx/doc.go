// Package sqltx runs dedup's transactional handlers on a database/sql database
// (PostgreSQL, MySQL/MariaDB or SQLite): [Transactor] implements
// dedup.Transactor for *sql.Tx (docs/design.md §9). A run's marker row is
// written in the transaction its fn writes in, so that "processed" commits or
// rolls back with the effect, and the marker, not Redis, decides whether a
// message was processed. Effects outside the transaction are not covered.
//
// The marker table holds, per handler and record, the SHA-256 of the record key
// (never the key), the payload fingerprint, the run's owner token and an
// expiry. Expiries are written and compared by the database's clock only, so
// clients with skewed clocks agree. [Transactor.Schema] returns the table's
// CREATE statements and [Transactor.Migrate] runs them. Expired markers cost
// space, not correctness: [Transactor.Sweep], or [WithSweep], deletes them.
//
// The package imports no driver; the program imports the one for its database:
//
//   - PostgreSQL: github.com/jackc/pgx/v5/stdlib (driver "pgx").
//   - MySQL 8 / MariaDB 10.5+: github.com/go-sql-driver/mysql (driver "mysql").
//     Set interpolateParams=true in the DSN to save a prepare round trip per
//     statement.
//   - SQLite: modernc.org/sqlite (driver "sqlite"). Open a file (an in-memory
//     database is one per connection) with a busy timeout, so that Begin waits
//     for another transaction's write lock instead of failing with SQLITE_BUSY:
//     "file:markers.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)".
//
// A Commit whose COMMIT may have reached the server returns an error wrapping
// dedup.ErrCommitUnknown; any other Commit error means the transaction was
// rolled back. docs/transactional.md tells how the two are told apart.
package sqltx
