package markersql

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// now is the database's clock in each dialect, as the expires_at column holds it.
// PostgreSQL's now() is the transaction's start, fixed for its length: a Begin that
// waited behind another transaction's marker compares with the time it began, which
// can only make a marker look younger (found, not taken over), never older. MySQL's
// UTC_TIMESTAMP(6) does not depend on the session's time_zone. SQLite's 'now' is
// fixed within one statement, and unixepoch('subsec') needs SQLite 3.42.
func (t Table) now() string {
	switch t.d {
	case Postgres:
		return "now()"
	case MySQL:
		return "UTC_TIMESTAMP(6)"
	default:
		return "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
	}
}

// expiry is the expires_at of a marker written now whose retention is the argument
// p, in RetentionUnit.
func (t Table) expiry(p string) string {
	switch t.d {
	case Postgres:
		return "now() + " + p + "::bigint * interval '1 microsecond'"
	case MySQL:
		return "UTC_TIMESTAMP(6) + INTERVAL " + p + " MICROSECOND"
	default:
		return t.now() + " + " + p
	}
}

// RetentionUnit is the unit of a retention argument: microseconds, as DATETIME(6)
// and TIMESTAMPTZ hold them, and milliseconds for SQLite's integer column.
func (t Table) RetentionUnit() time.Duration {
	if t.d == SQLite {
		return time.Millisecond
	}
	return time.Microsecond
}

// placeholders numbers PostgreSQL's parameters; the others take '?'.
type placeholders struct {
	d Dialect
	n int
}

func (p *placeholders) next() string {
	p.n++
	if p.d == Postgres {
		return "$" + strconv.Itoa(p.n)
	}
	return "?"
}

// Insert returns the statement that writes n markers, each with the arguments
// handler, key_hash, fingerprint, owner and retention (InsertArgs). A marker is
// inserted when its row is absent, and takes an expired row's place; an unexpired
// row is left alone. PostgreSQL and SQLite return the rows inserted or taken over
// (handler, key_hash); MySQL returns nothing (see WriteMarkers).
func (t Table) Insert(n int) string {
	var b strings.Builder
	p := placeholders{d: t.d}
	b.WriteString("INSERT INTO " + t.String())
	if t.d != MySQL {
		b.WriteString(" AS m")
	}
	b.WriteString(" (handler, key_hash, fingerprint, owner, expires_at) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, %s, %s, %s, %s)", p.next(), p.next(), p.next(), p.next(), t.expiry(p.next()))
	}
	switch t.d {
	case MySQL:
		// No RETURNING, and the affected-rows count cannot tell which row did what
		// (1 inserted, 2 updated, 0 or 1 unchanged, by the DSN's clientFoundRows): the
		// rows are classified by their owner afterwards. MySQL assigns left to right,
		// each IF seeing the columns already assigned: expires_at, which the test
		// reads, goes last. VALUES() is deprecated in MySQL 8.0.20 but is the one
		// spelling MariaDB knows too.
		exp := "expires_at <= " + t.now()
		b.WriteString(" ON DUPLICATE KEY UPDATE owner = IF(" + exp + ", VALUES(owner), owner), " +
			"fingerprint = IF(" + exp + ", VALUES(fingerprint), fingerprint), " +
			"expires_at = IF(" + exp + ", VALUES(expires_at), expires_at)")
	default:
		// DO UPDATE, not DO NOTHING: an expired row is taken over in the same
		// statement, and a row the WHERE leaves alone is still locked until the
		// transaction ends, so that its fingerprint read next cannot change.
		b.WriteString(" ON CONFLICT (handler, key_hash) DO UPDATE SET fingerprint = excluded.fingerprint, " +
			"owner = excluded.owner, expires_at = excluded.expires_at WHERE m.expires_at <= " + t.now() +
			" RETURNING handler, key_hash")
	}
	return b.String()
}

// SelectMarkers returns the statement that reads handler, key_hash, owner and
// fingerprint of up to n markers, each named by the arguments handler and key_hash.
// On MySQL it is a locking read (FOR UPDATE), which reads the latest committed rows
// whatever the isolation level (a plain SELECT under REPEATABLE READ could read an
// older snapshot); the rows are locked by the insert already, so it waits for
// nothing.
func (t Table) SelectMarkers(n int) string {
	var b strings.Builder
	p := placeholders{d: t.d}
	b.WriteString("SELECT handler, key_hash, owner, fingerprint FROM " + t.String() + " WHERE ")
	for i := range n {
		if i > 0 {
			b.WriteString(" OR ")
		}
		fmt.Fprintf(&b, "(handler = %s AND key_hash = %s)", p.next(), p.next())
	}
	if t.d == MySQL {
		b.WriteString(" FOR UPDATE")
	}
	return b.String()
}

// DeleteMarker returns the statement that deletes one marker by its arguments
// handler, key_hash and owner: only the row this run wrote, never one another run
// holds.
func (t Table) DeleteMarker() string {
	p := placeholders{d: t.d}
	return "DELETE FROM " + t.String() + " WHERE handler = " + p.next() + " AND key_hash = " + p.next() +
		" AND owner = " + p.next()
}

// Forget returns the statement that deletes one marker by its arguments handler and
// key_hash, whoever wrote it: an operator's "run this message again".
func (t Table) Forget() string {
	p := placeholders{d: t.d}
	return "DELETE FROM " + t.String() + " WHERE handler = " + p.next() + " AND key_hash = " + p.next()
}

// Lookup returns the statement that reads one marker by its arguments handler and
// key_hash: owner, fingerprint, and the microseconds until it expires (negative once
// expired), by the database's clock.
func (t Table) Lookup() string {
	p := placeholders{d: t.d}
	var left string
	switch t.d {
	case Postgres:
		left = "CAST(EXTRACT(EPOCH FROM (expires_at - now())) * 1000000 AS BIGINT)"
	case MySQL:
		left = "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)"
	default:
		left = "(expires_at - " + t.now() + ") * 1000"
	}
	return "SELECT owner, fingerprint, " + left + " FROM " + t.String() + " WHERE handler = " + p.next() +
		" AND key_hash = " + p.next()
}

// SweepBatch returns the statement that deletes at most its one argument's number of
// expired markers. The DELETE's own WHERE tests the expiry, by the database's clock,
// so that a marker taken over since the rows were picked is never deleted.
//
// PostgreSQL has no DELETE … LIMIT: the rows are picked by ctid in a subquery that
// skips rows locked by a Begin taking them over (SKIP LOCKED) instead of waiting
// for it. SQLite's DELETE … LIMIT needs a compile-time option: a rowid subquery
// does the same. MySQL has DELETE … LIMIT; its caller runs it under READ COMMITTED,
// where InnoDB locks no gaps of the expires_at index that a Begin's insert could
// need.
func (t Table) SweepBatch() string {
	p := placeholders{d: t.d}
	expired := "expires_at <= " + t.now()
	switch t.d {
	case Postgres:
		return "DELETE FROM " + t.String() + " WHERE ctid = ANY(ARRAY(SELECT ctid FROM " + t.String() +
			" WHERE " + expired + " LIMIT " + p.next() + " FOR UPDATE SKIP LOCKED)) AND " + expired
	case MySQL:
		return "DELETE FROM " + t.String() + " WHERE " + expired + " ORDER BY expires_at LIMIT " + p.next()
	default:
		return "DELETE FROM " + t.String() + " WHERE rowid IN (SELECT rowid FROM " + t.String() +
			" WHERE " + expired + " LIMIT " + p.next() + ") AND " + expired
	}
}
