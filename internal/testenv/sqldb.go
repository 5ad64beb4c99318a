package testenv

import (
	"github.com/dedupkit/dedupkit/dedupkittest"

	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// Default addresses of the SQL servers CI starts (.ci/run).
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test"
)

// PostgresURL returns DEDUP_POSTGRES_URL, or skips the test (SkipNoServer).
func PostgresURL(t testing.TB) string {
	t.Helper()
	return dedupkittest.PostgresURL(t)
}

// MySQLDSN returns DEDUP_MYSQL_DSN (a go-sql-driver/mysql DSN), or skips the test
// (SkipNoServer).
func MySQLDSN(t testing.TB) string {
	t.Helper()
	d := os.Getenv("DEDUP_MYSQL_DSN")
	if d == "" {
		SkipNoServer(t, "DEDUP_MYSQL_DSN is not set (CI uses %s)", DefaultMySQLDSN)
	}
	return d
}

// PostgresHost returns the host:port of a PostgreSQL URL, for a proxy's upstream.
func PostgresHost(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		t.Fatalf("DEDUP_POSTGRES_URL: not a postgres:// URL with a host")
	}
	if u.Port() == "" {
		return u.Host + ":5432"
	}
	return u.Host
}

// WithPostgresHost returns rawURL with its host:port replaced (to go through a
// proxy).
func WithPostgresHost(rawURL, hostPort string) string {
	u, _ := url.Parse(rawURL)
	u.Host = hostPort
	return u.String()
}

// MySQLHost returns the host:port of a go-sql-driver DSN's tcp(...) address.
func MySQLHost(t testing.TB, dsn string) string {
	t.Helper()
	_, rest, ok := strings.Cut(dsn, "@tcp(")
	addr, _, ok2 := strings.Cut(rest, ")")
	if !ok || !ok2 {
		t.Fatalf("DEDUP_MYSQL_DSN: want user@tcp(host:port)/db")
	}
	return addr
}

// WithMySQLHost returns dsn with its tcp(...) address replaced.
func WithMySQLHost(dsn, hostPort string) string {
	before, rest, _ := strings.Cut(dsn, "@tcp(")
	_, after, _ := strings.Cut(rest, ")")
	return before + "@tcp(" + hostPort + ")" + after
}

// OpenSQL opens a *sql.DB (the test imports the driver) and pings it: a server
// that does not answer skips the test (SkipNoServer). Cleanup closes it.
func OpenSQL(t testing.TB, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", driverName, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		SkipNoServer(t, "%s server does not answer: %v", driverName, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TableName returns a SQL table name no other test or run shares: "dkt_" and 12
// hex digits.
func TableName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "dkt_" + hex.EncodeToString(b[:])
}
