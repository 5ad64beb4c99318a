// Package sqltx runs dedup's transactional handlers on a database/sql database:
// PostgreSQL, MySQL/MariaDB or SQLite. It implements dedup.Transactor for *sql.Tx
// (docs/design.md §9): a run's marker row is written in the transaction its fn writes in, so
// that "processed" commits or rolls back with the effect, and the marker, not
// Redis, is the authority on whether a message was processed.
//
// The marker table holds, per handler and record, the SHA-256 digest of the record
// key (never the key), the payload fingerprint, the run's owner token and an expiry.
// Every expiry is written, and every "expired?" test made, by the database's clock
// inside the statement: no client clock is ever written or compared, so clients
// with skewed clocks agree. Schema returns the table's CREATE statements for the
// dialect; Migrate runs them. Expired markers cost space, not correctness (a Begin
// takes an expired marker's place): Sweep deletes them in bounded batches, and
// WithSweep runs it on a goroutine until Close.
//
// The package imports no driver; the program imports the one for its database:
//
//   - PostgreSQL: github.com/jackc/pgx/v5/stdlib (driver "pgx").
//   - MySQL 8 / MariaDB 10.5+: github.com/go-sql-driver/mysql (driver "mysql").
//     Each statement with arguments costs a prepare round trip unless the DSN sets
//     interpolateParams=true.
//   - SQLite: modernc.org/sqlite (driver "sqlite", pure Go). Open a file (an
//     in-memory database is one per connection) with a busy timeout, so that a
//     Begin waits for another transaction's write lock instead of failing with
//     SQLITE_BUSY: "file:markers.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)".
//
// Errors are classified without driver types (commit.go): a COMMIT that may have
// reached the server (written, and the connection lost before the answer) returns
// an error wrapping dedup.ErrCommitUnknown; any other Commit error means the
// transaction was rolled back, a COMMIT the driver never sent included (the
// connection closed already, driver.ErrBadConn, pgconn's SafeToRetry). Effects
// outside the transaction (an HTTP call, a message sent) are not covered by the
// marker.
package sqltx
