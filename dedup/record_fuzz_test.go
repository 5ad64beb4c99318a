package dedup

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The Lua scripts parse a record with string.match(v, '^([pd]):([^:]*):(.*)$'), and
// release.lua and extend.lua take an IN PROGRESS owner with '^p:([^:]*):'. These are
// the same patterns as Go regexps. (?s): Lua's '.' matches any byte, '\n' included.
// Go matches invalid UTF-8 one byte at a time and reports byte offsets, so the
// captures are the same bytes Lua would capture.
var (
	luaRecord = regexp.MustCompile(`(?s)^([pd]):([^:]*):(.*)$`)
	luaOwner  = regexp.MustCompile(`^p:([^:]*):`)
)

// FuzzRecord checks the record codec: decodeRecord never panics and accepts exactly
// the values the Lua scripts parse, with the same parts; what it accepts is the
// encoding of those parts; and every record dedup can write (a valid token, any
// fingerprint) decodes back to what was written.
func FuzzRecord(f *testing.F) {
	f.Add("p:tok:", byte('p'), "tok", "")
	f.Add("d:tok:fp", byte('d'), "tok", "fp")
	f.Fuzz(func(t *testing.T, v string, state byte, token, fp string) {
		st, tok, gotFP, ok := decodeRecord(v)
		m := luaRecord.FindStringSubmatch(v)
		if ok != (m != nil) {
			t.Fatalf("decodeRecord(%q) ok=%v, but the Lua pattern matches=%v", v, ok, m != nil)
		}
		if ok {
			if string(st) != m[1] || tok != m[2] || gotFP != m[3] {
				t.Fatalf("decodeRecord(%q) = %q %q %q, the Lua pattern gives %q", v, st, tok, gotFP, m[1:])
			}
			if again := encodeRecord(st, tok, gotFP); again != v {
				t.Fatalf("decodeRecord(%q) parts encode to %q", v, again)
			}
			if o := luaOwner.FindStringSubmatch(v); (st == stateInProgress) != (o != nil) || (o != nil && o[1] != tok) {
				t.Fatalf("%q: owner pattern gives %q, decodeRecord state %q token %q", v, o, st, tok)
			}
		}

		if (state != stateInProgress && state != stateDone) || checkToken(token) != nil {
			return // dedup never writes such a record
		}
		enc := encodeRecord(state, token, fp)
		st, tok, gotFP, ok = decodeRecord(enc)
		if !ok || st != state || tok != token || gotFP != fp {
			t.Fatalf("decodeRecord(encodeRecord(%q, %q, %q) = %q) = %q %q %q %v", state, token, fp, enc, st, tok, gotFP, ok)
		}
		if m := luaRecord.FindStringSubmatch(enc); m == nil || m[1] != string(state) || m[2] != token || m[3] != fp {
			t.Fatalf("Lua pattern on %q gives %q, want %q %q %q", enc, m, state, token, fp)
		}
	})
}

// recordParseCases are values the Go regexp stand-in for the Lua pattern must treat
// as Lua does: separators, newlines, NUL, invalid UTF-8.
var recordParseCases = []string{
	"p:t:", "d:t:f", "p::", "d:t:a:b", "p:t", "x:t:f", "P:t:f", ":p:t:", "pp:t:", "",
	"p:t:\n", "d:t:line1\nline2", "p:\n:x", "\np:t:", "d:t\x00:f", "d:\x00:\x00", "p:\xff\xfe:\x80",
	"d:t:f\r\n", "d:" + strings.Repeat("x", 64) + ":" + strings.Repeat(":", 10),
}

// TestRecordParseMatchesLua runs the Lua parsing rule itself (EVAL) on miniredis's Lua
// and on a real redis-server, and checks it against decodeRecord and the Go regexp
// FuzzRecord uses in its place.
func TestRecordParseMatchesLua(t *testing.T) {
	const script = `local s, tok, fp = string.match(ARGV[1], '^([pd]):([^:]*):(.*)$')
local o = string.match(ARGV[1], '^p:([^:]*):')
if not s then return {0, '', '', o or false} end
return {1, s .. ':' .. tok, fp, o or false}`
	run := func(t *testing.T, c redis.UniversalClient) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, v := range recordParseCases {
			res, err := c.Eval(ctx, script, nil, v).Slice()
			if err != nil {
				t.Fatalf("EVAL on %q: %v", v, err)
			}
			st, tok, fp, ok := decodeRecord(v)
			luaOK := res[0].(int64) == 1
			if luaOK != ok {
				t.Errorf("%q: Lua matches=%v, decodeRecord ok=%v", v, luaOK, ok)
				continue
			}
			if ok && (res[1] != string(st)+":"+tok || res[2] != fp) {
				t.Errorf("%q: Lua gives %q %q, decodeRecord %q %q %q", v, res[1], res[2], st, tok, fp)
			}
			luaOwnerTok, luaHasOwner := res[3].(string)
			o := luaOwner.FindStringSubmatch(v)
			if luaHasOwner != (o != nil) || (o != nil && o[1] != luaOwnerTok) {
				t.Errorf("%q: Lua owner %q (%v), Go regexp %q", v, luaOwnerTok, luaHasOwner, o)
			}
			if m := luaRecord.FindStringSubmatch(v); (m != nil) != luaOK {
				t.Errorf("%q: Lua matches=%v, Go regexp %q", v, luaOK, m)
			}
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		_, c := newMiniredis(t)
		run(t, c)
	})
	t.Run("redis-server", func(t *testing.T) {
		run(t, realRedis(t, testenv.Prefix()))
	})
}
