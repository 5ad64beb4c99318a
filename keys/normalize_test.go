package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func TestNormalizeKeepsPlainKeysAndHashesTheRest(t *testing.T) {
	plain64 := strings.Repeat("a", 64)
	tests := []struct {
		name, raw, want string
	}{
		{"plain", "msg-1", "msg-1"},
		{"plain charset", "AZaz09._:/@=+-", "AZaz09._:/@=+-"},
		{"plain 64 bytes", plain64, plain64},
		{"empty is hashed", "", "~e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"65 plain bytes are hashed", plain64 + "a", "~635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
		{"space is hashed", "order 42", "~59096d5ad4f7817da522986575e827c4ce75eee92fd1a6a5668fcb6a763a9604"},
		{"hashed form is rehashed", "~e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
			"~" + sha256Hex("~e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Normalize(tt.raw); got != tt.want {
				t.Errorf("Normalize(%q) = %q, want %q", tt.raw, got, tt.want)
			}
		})
	}
}

// Every byte outside the plain set forces the hashed form; every byte inside keeps the plain one.
func TestNormalizeHashesEveryByteOutsideThePlainSet(t *testing.T) {
	const plainSet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/@=+-"
	for c := 0; c < 256; c++ {
		raw := "k" + string([]byte{byte(c)})
		got := Normalize(raw)
		if strings.IndexByte(plainSet, byte(c)) >= 0 {
			if got != raw {
				t.Errorf("Normalize(%q) = %q, want it unchanged", raw, got)
			}
		} else if got != "~"+sha256Hex(raw) {
			t.Errorf("Normalize(%q) = %q, want the hashed form", raw, got)
		}
	}
}

func TestNormalizeOfAPlainKeyDoesNotAllocate(t *testing.T) {
	raw := strings.Repeat("a", MaxPlainLen)
	var got string
	if n := testing.AllocsPerRun(100, func() { got = Normalize(raw) }); n != 0 {
		t.Errorf("Normalize(plain) allocated %v times per run, want 0", n)
	}
	if got != raw {
		t.Errorf("Normalize(plain) = %q, want %q", got, raw)
	}
}

func TestRecordKeyIsPrefixHandlerAndNormalizedKey(t *testing.T) {
	tests := []struct {
		prefix, handler, raw, want string
	}{
		{"dedup", "orders", "msg-1", "dedup:orders:msg-1"},
		{"{dedup}", "orders.v2", "a:b", "{dedup}:orders.v2:a:b"},
		{"dedup", "orders", "", "dedup:orders:~e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"dedup", "h", strings.Repeat("a", 65), "dedup:h:~635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
	}
	for _, tt := range tests {
		if got := RecordKey(tt.prefix, tt.handler, tt.raw); got != tt.want {
			t.Errorf("RecordKey(%q, %q, %q) = %q, want %q", tt.prefix, tt.handler, tt.raw, got, tt.want)
		}
		if got, want := RecordKey(tt.prefix, tt.handler, tt.raw), tt.prefix+":"+tt.handler+":"+Normalize(tt.raw); got != want {
			t.Errorf("RecordKey disagrees with Normalize: %q vs %q", got, want)
		}
	}
}

func TestValidateNameRefusesEmptyLongAndOutOfSetNames(t *testing.T) {
	long := strings.Repeat("n", MaxNameLen+1)
	tests := []struct {
		name, wantErr string
	}{
		{"orders", ""},
		{"Orders_v2.retry-1", ""},
		{strings.Repeat("n", MaxNameLen), ""},
		{"", "keys: invalid: handler name is empty"},
		{long, `keys: invalid: handler name "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"... is 65 bytes, longer than 64`},
		{"a:b", `keys: invalid: handler name "a:b": byte ":" at offset 1 is not in [A-Za-z0-9._-]`},
		{"a b", `keys: invalid: handler name "a b": byte " " at offset 1 is not in [A-Za-z0-9._-]`},
		{"a/b", `keys: invalid: handler name "a/b": byte "/" at offset 1 is not in [A-Za-z0-9._-]`},
		{"\xff", `keys: invalid: handler name "\xff": byte "\xff" at offset 0 is not in [A-Za-z0-9._-]`},
		{"{x}", `keys: invalid: handler name "{x}": byte "{" at offset 0 is not in [A-Za-z0-9._-]`},
	}
	for _, tt := range tests {
		checkErr(t, "ValidateName", tt.name, ValidateName(tt.name), tt.wantErr)
	}
}

func TestValidatePrefixRefusesSeparatorsGlobsAndLongPrefixes(t *testing.T) {
	tests := []struct {
		prefix, wantErr string
	}{
		{"dedup", ""},
		{"{dedup}app", ""},
		{"acme:eu", `keys: invalid: key prefix "acme:eu": ':' at offset 4 separates prefix and handler; it may not appear in a prefix`},
		{"!~", ""},
		{"a*", `keys: invalid: key prefix "a*": "*" at offset 1 is a Redis glob character (*?[]\); it may not appear in a prefix`},
		{"a?b", `keys: invalid: key prefix "a?b": "?" at offset 1 is a Redis glob character (*?[]\); it may not appear in a prefix`},
		{"[ab]", `keys: invalid: key prefix "[ab]": "[" at offset 0 is a Redis glob character (*?[]\); it may not appear in a prefix`},
		{`a\b`, `keys: invalid: key prefix "a\\b": "\\" at offset 1 is a Redis glob character (*?[]\); it may not appear in a prefix`},
		{strings.Repeat("p", MaxNameLen), ""},
		{"", "keys: invalid: key prefix is empty"},
		{strings.Repeat("p", 1000), `keys: invalid: key prefix "pppppppppppppppppppppppppppppppp"... is 1000 bytes, longer than 64`},
		{"de dup", `keys: invalid: key prefix "de dup": byte " " at offset 2 is not printable ASCII (0x21..0x7e)`},
		{"dedup\n", `keys: invalid: key prefix "dedup\n": byte "\n" at offset 5 is not printable ASCII (0x21..0x7e)`},
		{"d\x7f", `keys: invalid: key prefix "d\x7f": byte "\x7f" at offset 1 is not printable ASCII (0x21..0x7e)`},
		{"dédup", `keys: invalid: key prefix "dédup": byte "\xc3" at offset 1 is not printable ASCII (0x21..0x7e)`},
	}
	for _, tt := range tests {
		checkErr(t, "ValidatePrefix", tt.prefix, ValidatePrefix(tt.prefix), tt.wantErr)
	}
}

func checkErr(t *testing.T, fn, arg string, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("%s(%q) = %v, want nil", fn, arg, err)
	case wantErr == "":
	case err == nil:
		t.Errorf("%s(%q) = nil, want %q", fn, arg, wantErr)
	case err.Error() != wantErr:
		t.Errorf("%s(%q) = %q, want %q", fn, arg, err, wantErr)
	case !errors.Is(err, ErrInvalid):
		t.Errorf("%s(%q): errors.Is(err, ErrInvalid) = false", fn, arg)
	}
}

// sha256Hex is the reference digest, computed independently of the code under test.
func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
