package keys

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/; the f.Add calls below only
// repeat the most basic case so each target has a seed even without testdata.

func FuzzNormalize(f *testing.F) {
	f.Add("msg-1", "msg-2")
	f.Fuzz(func(t *testing.T, a, b string) {
		na := Normalize(a)
		if len(na) > hashedLen {
			t.Fatalf("len(Normalize(%q)) = %d, want <= %d", a, len(na), hashedLen)
		}
		if again := Normalize(a); again != na {
			t.Fatalf("Normalize(%q) not deterministic: %q then %q", a, na, again)
		}
		checkForm(t, a, na)
		if nb := Normalize(b); (a != b) != (na != nb) {
			t.Fatalf("Normalize(%q) = %q, Normalize(%q) = %q: equal outputs must mean equal inputs", a, na, b, nb)
		}
	})
}

// checkForm fails unless n is raw itself (when raw is plain) or "~" + the
// reference SHA-256 of raw (otherwise).
func checkForm(t *testing.T, raw, n string) {
	t.Helper()
	plain := len(raw) >= 1 && len(raw) <= MaxPlainLen
	for i := 0; i < len(raw) && plain; i++ {
		plain = strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/@=+-", raw[i]) >= 0
	}
	if plain && n != raw {
		t.Fatalf("Normalize(%q) = %q, want the plain key unchanged", raw, n)
	}
	if !plain && n != "~"+sha256Hex(raw) {
		t.Fatalf("Normalize(%q) = %q, want the hashed form", raw, n)
	}
}

func FuzzComposite(f *testing.F) {
	f.Add("a|b", "c", "a", "b|c")
	s := Composite(Header("1"), Header("2"))
	key := func(p1, p2 string) string {
		return s.Key(Raw{Headers: map[string]string{"1": p1, "2": p2}})
	}
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2 string) {
		ka, kb := key(a1, a2), key(b1, b2)
		for _, c := range [][3]string{{a1, a2, ka}, {b1, b2, kb}} {
			if c[0] == "" || c[1] == "" {
				if c[2] != "" {
					t.Fatalf("Composite(%q, %q) = %q, want \"\" for an empty part", c[0], c[1], c[2])
				}
				continue
			}
			if parts := decodeComposite(t, c[2]); len(parts) != 2 || parts[0] != c[0] || parts[1] != c[1] {
				t.Fatalf("Composite(%q, %q) = %q decodes to %q", c[0], c[1], c[2], parts)
			}
		}
		allSet := a1 != "" && a2 != "" && b1 != "" && b2 != ""
		if allSet && (a1 != b1 || a2 != b2) && ka == kb {
			t.Fatalf("Composite(%q, %q) == Composite(%q, %q) == %q", a1, a2, b1, b2, ka)
		}
	})
}

// decodeComposite splits a composite key back into its parts; it fails the
// test if k is not a well-formed length-prefixed join.
func decodeComposite(t *testing.T, k string) []string {
	t.Helper()
	var parts []string
	for k != "" {
		i := strings.IndexByte(k, ':')
		if i <= 0 {
			t.Fatalf("composite %q: no length prefix", k)
		}
		n, err := strconv.Atoi(k[:i])
		if err != nil || n < 0 || n > len(k)-i-1 || strconv.Itoa(n) != k[:i] {
			t.Fatalf("composite %q: bad length prefix %q", k, k[:i])
		}
		parts = append(parts, k[i+1:i+1+n])
		k = k[i+1+n:]
	}
	return parts
}

func FuzzRecordKey(f *testing.F) {
	f.Add("orders", "payments", "msg-1", "msg-1")
	const prefix = "dedup"
	f.Fuzz(func(t *testing.T, h1, h2, raw1, raw2 string) {
		if ValidateName(h1) != nil || ValidateName(h2) != nil {
			return
		}
		k1, k2 := RecordKey(prefix, h1, raw1), RecordKey(prefix, h2, raw2)
		for _, c := range [][3]string{{h1, raw1, k1}, {h2, raw2, k2}} {
			if max := len(prefix) + 1 + MaxNameLen + 1 + hashedLen; len(c[2]) > max {
				t.Fatalf("RecordKey(%q, %q, %q) is %d bytes, want <= %d", prefix, c[0], c[1], len(c[2]), max)
			}
			if want := prefix + ":" + c[0] + ":" + Normalize(c[1]); c[2] != want {
				t.Fatalf("RecordKey(%q, %q, %q) = %q, want %q", prefix, c[0], c[1], c[2], want)
			}
		}
		if h1 != h2 && k1 == k2 {
			t.Fatalf("handlers %q and %q share record key %q", h1, h2, k1)
		}
		if (h1 == h2) && (raw1 != raw2) == (k1 == k2) {
			t.Fatalf("RecordKey(%q, %q / %q): keys %q and %q", h1, raw1, raw2, k1, k2)
		}
	})
}

func FuzzStrategies(f *testing.F) {
	f.Add([]byte("msg-1"), []byte("hello"))
	f.Fuzz(func(t *testing.T, header, body []byte) {
		h := string(header)
		m := Raw{
			Headers: map[string]string{
				h:                  h,
				"Nats-Msg-Id":      h,
				"Correlation-Id":   h,
				"X-Correlation-Id": h,
			},
			Body: body,
		}
		orig := bytes.Clone(body)
		strategies := []Strategy{
			Header(h), Header(""), Header("Nats-Msg-Id"), Header("Missing"),
			CorrelationID(), Payload(), Custom(nil),
			Custom(func(m Message) string { return m.Header(h) + string(m.Data()) }),
			Composite(), Composite(nil), Composite(Header(h), Payload(), Header(h)),
			Composite(Composite(Header(h)), FirstOf(Header("Missing"), Payload())),
			FirstOf(), FirstOf(nil, Custom(nil), Header(""), Header("Missing"), Payload(), Header(h)),
		}
		for i, s := range strategies {
			for _, msg := range []Message{m, Raw{}, nil} {
				if _, isCustom := s.(customStrategy); isCustom && msg == nil {
					continue // a user func is free to dereference the message
				}
				k := s.Key(msg)
				if n := Normalize(k); len(n) > hashedLen {
					t.Fatalf("strategy %d: len(Normalize) = %d", i, len(n))
				}
				if rk := RecordKey("{dedup}", "h", k); len(rk) > len("{dedup}:h:")+hashedLen {
					t.Fatalf("strategy %d: len(RecordKey) = %d", i, len(rk))
				}
			}
			if v, ok := s.(Validator); ok {
				_ = v.Validate()
			}
		}
		if got := Header("Nats-Msg-Id").Key(m); got != h {
			t.Fatalf("Header = %q, want the raw value %q", got, h)
		}
		if got, want := Payload().Key(m), sha256Hex(string(body)); len(body) > 0 && got != want {
			t.Fatalf("Payload = %q, want %q", got, want)
		}
		if got := CorrelationID().Key(m); got != h {
			t.Fatalf("CorrelationID = %q, want %q", got, h)
		}
		if got, want := FirstOf(Header("Missing"), Header("Nats-Msg-Id"), Payload()).Key(m), h; h != "" && got != want {
			t.Fatalf("FirstOf = %q, want the first non-empty key %q", got, want)
		}
		if got := Custom(func(Message) string { return h }).Key(m); got != h {
			t.Fatalf("Custom = %q, want its func's %q", got, h)
		}
		if got, want := Composite(Header("Nats-Msg-Id")).Key(m), strconv.Itoa(len(h))+":"+h; h != "" && got != want {
			t.Fatalf("Composite = %q, want %q", got, want)
		}
		if !bytes.Equal(body, orig) {
			t.Fatalf("a strategy modified Data(): %q, want %q", body, orig)
		}
	})
}

// FuzzTenants checks that two (prefix, handler) namespaces never share a record key:
// with valid prefixes and handler names, the keys differ whenever the namespaces do.
func FuzzTenants(f *testing.F) {
	f.Add("acme", "eu", "orders:123", "acme:eu", "orders", "123")
	f.Fuzz(func(t *testing.T, p1, h1, raw1, p2, h2, raw2 string) {
		if ValidatePrefix(p1) != nil || ValidatePrefix(p2) != nil || ValidateName(h1) != nil || ValidateName(h2) != nil {
			return
		}
		if (p1 != p2 || h1 != h2) && RecordKey(p1, h1, raw1) == RecordKey(p2, h2, raw2) {
			t.Fatalf("(%q, %q, %q) and (%q, %q, %q) share %q", p1, h1, raw1, p2, h2, raw2, RecordKey(p1, h1, raw1))
		}
	})
}
