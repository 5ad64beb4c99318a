package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unsafe"
)

// MaxPlainLen is the longest raw key [Normalize] returns unchanged.
const MaxPlainLen = 64

// MaxNameLen is the longest handler name [ValidateName] and the longest prefix
// [ValidatePrefix] accept, in bytes.
const MaxNameLen = 64

// hashedLen is the length of the hashed form: '~' and 64 hex digits.
const hashedLen = 1 + 2*sha256.Size

// hashMark starts every hashed key. It is not a plain byte, so a hashed key is
// never a plain one.
const hashMark = '~'

// plainByte reports the bytes a plain key may hold: [A-Za-z0-9._:/@=+-].
var plainByte = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "._:/@=+-" {
		t[c] = true
	}
	return t
}()

// nameByte reports the bytes a handler name may hold: [A-Za-z0-9._-]. It has
// no ':', so the handler part of a record key always ends at the first ':'
// after the prefix.
var nameByte = func() (t [256]bool) {
	t = plainByte
	for _, c := range ":/@=+" {
		t[c] = false
	}
	return t
}()

// isPlain reports whether raw is 1..MaxPlainLen plain bytes.
func isPlain(raw string) bool {
	if len(raw) == 0 || len(raw) > MaxPlainLen {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if !plainByte[raw[i]] {
			return false
		}
	}
	return true
}

// Normalize bounds a raw key. A plain key (1..[MaxPlainLen] bytes of
// [A-Za-z0-9._:/@=+-]) is returned as is, without allocating; any other, ""
// included, becomes "~" and its hex SHA-256 (65 bytes), which no plain key equals.
func Normalize(raw string) string {
	if isPlain(raw) {
		return raw
	}
	var b [hashedLen]byte
	appendHashed(b[:0], raw)
	return string(b[:])
}

// appendHashed appends the hashed form of raw to b.
func appendHashed(b []byte, raw string) []byte {
	// A read-only view of raw: []byte(raw) would copy keys longer than 32
	// bytes, and keys may be megabytes. Sum256 only reads its argument.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(raw), len(raw)))
	b = append(b, hashMark)
	return hex.AppendEncode(b, sum[:])
}

// RecordKey returns prefix + ":" + handler + ":" + Normalize(raw), in one
// allocation. It does not check prefix or handler: validate them once with
// [ValidatePrefix] and [ValidateName]. With valid parts, distinct (handler, raw)
// pairs give distinct keys.
func RecordKey(prefix, handler, raw string) string {
	if isPlain(raw) {
		return prefix + ":" + handler + ":" + raw
	}
	var sb strings.Builder
	sb.Grow(len(prefix) + 1 + len(handler) + 1 + hashedLen)
	sb.WriteString(prefix)
	sb.WriteByte(':')
	sb.WriteString(handler)
	sb.WriteByte(':')
	var b [hashedLen]byte
	sb.Write(appendHashed(b[:0], raw))
	return sb.String()
}

// ValidateName checks a handler name: 1..[MaxNameLen] bytes of [A-Za-z0-9._-].
// The error wraps [ErrInvalid].
func ValidateName(name string) error {
	switch {
	case name == "":
		return invalidf("handler name is empty")
	case len(name) > MaxNameLen:
		return invalidf("handler name %s is %d bytes, longer than %d", quote(name), len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte[name[i]] {
			return invalidf("handler name %s: byte %s at offset %d is not in [A-Za-z0-9._-]",
				quote(name), quote(name[i:i+1]), i)
		}
	}
	return nil
}

// ValidatePrefix checks a record key prefix: 1..[MaxNameLen] bytes of printable
// ASCII (0x21..0x7e) other than ':', which could let one prefix reproduce
// another's keys, and the Redis glob characters * ? [ ] \. Braces are allowed,
// for a Cluster hash tag such as "{dedup}". The error wraps [ErrInvalid].
func ValidatePrefix(prefix string) error {
	switch {
	case prefix == "":
		return invalidf("key prefix is empty")
	case len(prefix) > MaxNameLen:
		return invalidf("key prefix %s is %d bytes, longer than %d", quote(prefix), len(prefix), MaxNameLen)
	}
	for i := 0; i < len(prefix); i++ {
		if c := prefix[i]; c < 0x21 || c > 0x7e {
			return invalidf("key prefix %s: byte %s at offset %d is not printable ASCII (0x21..0x7e)",
				quote(prefix), quote(prefix[i:i+1]), i)
		}
		if prefix[i] == ':' {
			return invalidf("key prefix %s: ':' at offset %d separates prefix and handler; it may not appear in a prefix",
				quote(prefix), i)
		}
		if strings.IndexByte(globBytes, prefix[i]) >= 0 {
			return invalidf("key prefix %s: %s at offset %d is a Redis glob character (%s); it may not appear in a prefix",
				quote(prefix), quote(prefix[i:i+1]), i, globBytes)
		}
	}
	return nil
}

// globBytes are Redis's glob metacharacters. A prefix is matched as "<prefix>:*"
// (ACL key patterns, the SCAN that deletes its records), so one of these in it
// would match other prefixes' keys.
const globBytes = `*?[]\`
