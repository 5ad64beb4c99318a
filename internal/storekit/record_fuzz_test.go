package storekit

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The Lua scripts parse a record with string.match(v, '^([pd]):([^:]*):(.*)$'), a
// DONE record with a reply with '^r:([^:]*):(%d+):()' and its fingerprint's length,
// and release.lua and extend.lua take an IN PROGRESS owner with '^p:([^:]*):'. These
// are the same patterns as Go regexps. (?s): Lua's '.' matches any byte, '\n'
// included. Go matches invalid UTF-8 one byte at a time and reports byte offsets, so
// the captures are the same bytes Lua would capture.
var (
	luaRecord = regexp.MustCompile(`(?s)^([pd]):([^:]*):(.*)$`)
	luaReply  = regexp.MustCompile(`(?s)^r:([^:]*):([0-9]+):`)
	luaOwner  = regexp.MustCompile(`^p:([^:]*):`)
)

// luaParse is what the scripts make of v, by the Go stand-ins of their patterns:
// state ("p", "d" or "r"), token, fingerprint and, for "r", the reply.
func luaParse(v string) (state, token, fp, reply string, ok bool) {
	if m := luaRecord.FindStringSubmatch(v); m != nil {
		return m[1], m[2], m[3], "", true
	}
	m := luaReply.FindStringSubmatch(v)
	if m == nil || len(m[2]) > 7 {
		return "", "", "", "", false
	}
	n, _ := strconv.Atoi(m[2])
	at := len(m[0])
	if at+n > len(v) {
		return "", "", "", "", false
	}
	return "r", m[1], v[at : at+n], v[at+n:], true
}

// FuzzRecord checks the record codec: parseRecord never panics and accepts exactly
// the values the Lua scripts parse, with the same parts; what it accepts is the
// encoding of those parts; every record dedup can write (a valid token, any
// fingerprint and reply) parses back to what was written; and no record with a
// reply is taken for a record by the pattern of a process from before stored
// replies (it refuses it instead: see record.go).
func FuzzRecord(f *testing.F) {
	f.Add("p:tok:", byte('p'), "tok", "", "")
	f.Add("d:tok:fp", byte('d'), "tok", "fp", "")
	f.Add("r:tok:2:fp{\"ok\":1}", byte('r'), "tok", "fp", "\x00:r:1:")
	f.Fuzz(func(t *testing.T, v string, state byte, token, fp, reply string) {
		r, ok := Parse(v)
		lst, ltok, lfp, lreply, lok := luaParse(v)
		if ok != lok {
			t.Fatalf("parseRecord(%q) ok=%v, but the Lua patterns match=%v", v, ok, lok)
		}
		if ok {
			st := string(r.State)
			if r.HasReply {
				st = "r"
			}
			if st != lst || r.Token != ltok || r.FP != lfp || r.Reply != lreply {
				t.Fatalf("parseRecord(%q) = %+v, the Lua patterns give %q %q %q %q", v, r, lst, ltok, lfp, lreply)
			}
			again := Encode(r.State, r.Token, r.FP)
			if r.HasReply {
				again = EncodeReply(r.Token, r.FP, r.Reply)
			}
			if again != v && !(r.HasReply && leadingZeros(v)) {
				t.Fatalf("parseRecord(%q) parts encode to %q", v, again)
			}
			if o := luaOwner.FindStringSubmatch(v); (r.State == StateInProgress) != (o != nil) || (o != nil && o[1] != r.Token) {
				t.Fatalf("%q: owner pattern gives %q, Parse state %q token %q", v, o, r.State, r.Token)
			}
		}

		if (state != StateInProgress && state != StateDone && state != StateReply) || CheckToken(token) != nil {
			return // dedup never writes such a record
		}
		enc := Encode(state, token, fp)
		want := Rec{State: state, Token: token, FP: fp}
		if state == StateReply {
			enc = EncodeReply(token, fp, reply)
			want = Rec{State: StateDone, Token: token, FP: fp, Reply: reply, HasReply: true}
			if luaRecord.MatchString(enc) || luaOwner.MatchString(enc) {
				t.Fatalf("%q, a record with a reply, matches the patterns of processes without replies", enc)
			}
		}
		if got, ok := Parse(enc); !ok || got != want {
			t.Fatalf("parseRecord(%q) = %+v %v, want %+v", enc, got, ok, want)
		}
		if lst, ltok, lfp, lreply, lok := luaParse(enc); !lok || ltok != token || lfp != fp || lreply != want.Reply ||
			(lst == "r") != want.HasReply {
			t.Fatalf("Lua patterns on %q give %q %q %q %q %v, want %+v", enc, lst, ltok, lfp, lreply, lok, want)
		}
	})
}

// leadingZeros reports a record with a reply whose fingerprint length has leading
// zeros: read as its value (by Lua too), never written so.
func leadingZeros(v string) bool {
	m := luaReply.FindStringSubmatch(v)
	return m != nil && len(m[2]) > 1 && m[2][0] == '0'
}

// recordParseCases are values the Go regexp stand-ins for the Lua patterns must treat
// as Lua does: separators, newlines, NUL, invalid UTF-8, fingerprint lengths out of
// range.
var recordParseCases = []string{
	"p:t:", "d:t:f", "p::", "d:t:a:b", "p:t", "x:t:f", "P:t:f", ":p:t:", "pp:t:", "",
	"p:t:\n", "d:t:line1\nline2", "p:\n:x", "\np:t:", "d:t\x00:f", "d:\x00:\x00", "p:\xff\xfe:\x80",
	"d:t:f\r\n", "d:" + strings.Repeat("x", 64) + ":" + strings.Repeat(":", 10),
	"r:t:0:", "r:t:0:reply", "r:t:2:fpreply", "r:t:2:f", "r:t:3:fp", "r:t::fp", "r:t:x:fp", "r:t:-1:fp",
	"r:t:02:fpreply", "r:t:00000000:x", "r:t:99999999:x", "r:t:1:\x00\r\n:\xff", "r::0:", "r:t:0",
	"r:a:b:1:x", "r:t:4:a:b:reply:with:colons",
}

// TestRecordParseMatchesLua runs the Lua parsing rules themselves (EVAL) on
// miniredis's Lua and on a real redis-server, and checks them against parseRecord
// and the Go regexps FuzzRecord uses in their place.
func TestRecordParseMatchesLua(t *testing.T) {
	// claim.lua's parse, and the owner pattern of release.lua and extend.lua
	const script = `local s, tok, fp = string.match(ARGV[1], '^([pd]):([^:]*):(.*)$')
local reply = ''
if not s then
  local t, n, at = string.match(ARGV[1], '^r:([^:]*):(%d+):()')
  if t and #n <= 7 and at + tonumber(n) - 1 <= #ARGV[1] then
    s, tok, fp, reply = 'r', t, string.sub(ARGV[1], at, at + tonumber(n) - 1), string.sub(ARGV[1], at + tonumber(n))
  end
end
local o = string.match(ARGV[1], '^p:([^:]*):')
if not s then return {0, '', '', '', o or false} end
return {1, s .. ':' .. tok, fp, reply, o or false}`
	run := func(t *testing.T, c redis.UniversalClient) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, v := range recordParseCases {
			res, err := c.Eval(ctx, script, nil, v).Slice()
			if err != nil {
				t.Fatalf("EVAL on %q: %v", v, err)
			}
			r, ok := Parse(v)
			luaOK := res[0].(int64) == 1
			if luaOK != ok {
				t.Errorf("%q: Lua matches=%v, Parse ok=%v", v, luaOK, ok)
				continue
			}
			st := string(r.State)
			if r.HasReply {
				st = "r"
			}
			if ok && (res[1] != st+":"+r.Token || res[2] != r.FP || res[3] != r.Reply) {
				t.Errorf("%q: Lua gives %q %q %q, Parse %+v", v, res[1], res[2], res[3], r)
			}
			luaOwnerTok, luaHasOwner := res[4].(string)
			o := luaOwner.FindStringSubmatch(v)
			if luaHasOwner != (o != nil) || (o != nil && o[1] != luaOwnerTok) {
				t.Errorf("%q: Lua owner %q (%v), Go regexp %q", v, luaOwnerTok, luaHasOwner, o)
			}
			if _, _, _, _, gok := luaParse(v); gok != luaOK {
				t.Errorf("%q: Lua matches=%v, Go regexps %v", v, luaOK, gok)
			}
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		_, c := testenv.Miniredis(t)
		run(t, c)
	})
	t.Run("redis-server", func(t *testing.T) {
		run(t, testenv.Redis(t, testenv.Prefix()))
	})
}
