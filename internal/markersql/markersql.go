// Package markersql holds what packages sqltx and pgxtx share about the marker table:
// the table name's validation and quoting, the statements of each dialect, the checks
// on the markers a Begin writes, and the background sweeper. The statements compute
// every expiry and every "expired?" test with the database's own clock; no client
// time is ever written or compared.
package markersql

import (
	"errors"
	"fmt"
	"strings"
)

// Dialect is a SQL dialect of the marker statements.
type Dialect uint8

// The dialects.
const (
	Postgres Dialect = iota + 1
	MySQL
	SQLite
)

// maxIdent bounds each part of the table name: the index is named after the table
// with a suffix, and PostgreSQL cuts identifiers at 63 bytes, MySQL refuses more than
// 64.
const maxIdent = 48

const indexSuffix = "_expires_idx"

// ValidateTable checks a table name: an identifier (an ASCII letter or '_', then
// letters, digits or '_', at most 48 bytes), optionally qualified by one schema of
// the same form ("schema.table"). Nothing else can reach the SQL text: the name is
// spliced into statements (placeholders cannot stand for identifiers), so quotes,
// spaces, semicolons and comments are refused rather than escaped.
func ValidateTable(name string) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return fmt.Errorf("table %q: at most one '.' (schema.table)", name)
	}
	for _, p := range parts {
		if err := validateIdent(p); err != nil {
			return fmt.Errorf("table %q: %w", name, err)
		}
	}
	return nil
}

var errIdent = errors.New("not an identifier: want an ASCII letter or '_', then letters, digits or '_'")

func validateIdent(s string) error {
	if s == "" {
		return fmt.Errorf("empty name: %w", errIdent)
	}
	if len(s) > maxIdent {
		return fmt.Errorf("%d bytes, more than %d", len(s), maxIdent)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return errIdent
		}
	}
	return nil
}

// Table is a validated table name, quoted for one dialect.
type Table struct {
	d      Dialect
	schema string // "" when unqualified
	name   string
}

// NewTable validates name (ValidateTable) for dialect d.
func NewTable(d Dialect, name string) (Table, error) {
	if err := ValidateTable(name); err != nil {
		return Table{}, err
	}
	t := Table{d: d, name: name}
	if s, n, ok := strings.Cut(name, "."); ok {
		t.schema, t.name = s, n
	}
	return t, nil
}

// quote quotes a validated identifier. Quoting lets a name that is a reserved word
// (order, user) work; it cannot be needed for escaping, as validation admits no
// quote character.
func (t Table) quote(ident string) string {
	if t.d == MySQL {
		return "`" + ident + "`"
	}
	return `"` + ident + `"`
}

// String returns the quoted, possibly schema-qualified, table name.
func (t Table) String() string {
	if t.schema == "" {
		return t.quote(t.name)
	}
	return t.quote(t.schema) + "." + t.quote(t.name)
}

// Schema returns the statements that create the table and its expiry index if they
// do not exist.
func (t Table) Schema() []string {
	idx := t.quote(t.name + indexSuffix)
	switch t.d {
	case Postgres:
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.String() + ` (
	handler     VARCHAR(64) NOT NULL,
	key_hash    BYTEA       NOT NULL CHECK (octet_length(key_hash) = 32),
	fingerprint VARCHAR(32) NOT NULL DEFAULT '',
	owner       VARCHAR(64) NOT NULL,
	expires_at  TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (handler, key_hash)
)`,
			// An index lives in its table's schema: its own name is not qualified.
			`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t.String() + ` (expires_at)`}
	case MySQL:
		// VARBINARY, not VARCHAR: a handler, an owner or a fingerprint compares byte
		// for byte, whatever the server's collation (a _ci collation would make "A"
		// and "a" one handler, a PAD SPACE one "x" and "x "). MySQL has no CREATE
		// INDEX IF NOT EXISTS, so the index is declared with the table.
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.String() + ` (
	handler     VARBINARY(64) NOT NULL,
	key_hash    BINARY(32)    NOT NULL,
	fingerprint VARBINARY(32) NOT NULL DEFAULT '',
	owner       VARBINARY(64) NOT NULL,
	expires_at  DATETIME(6)   NOT NULL,
	PRIMARY KEY (handler, key_hash),
	KEY ` + idx + ` (expires_at)
) ENGINE=InnoDB`}
	default:
		// SQLite puts the schema (an attached database) on the index's name, and
		// wants the table unqualified.
		if t.schema != "" {
			idx = t.quote(t.schema) + "." + idx
		}
		return []string{`CREATE TABLE IF NOT EXISTS ` + t.String() + ` (
	handler     TEXT    NOT NULL,
	key_hash    BLOB    NOT NULL,
	fingerprint TEXT    NOT NULL DEFAULT '',
	owner       TEXT    NOT NULL,
	expires_at  INTEGER NOT NULL,
	PRIMARY KEY (handler, key_hash)
)`,
			`CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t.quote(t.name) + ` (expires_at)`}
	}
}

// SchemaText is Schema as one script, each statement ended by ';'.
func (t Table) SchemaText() string {
	return strings.Join(t.Schema(), ";\n") + ";\n"
}
