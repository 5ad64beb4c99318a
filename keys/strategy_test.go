package keys

import (
	"errors"
	"strings"
	"testing"
)

// validatorFunc is a Strategy whose Validate returns err: a user strategy
// whose error does not wrap ErrInvalid.
type validatorFunc struct{ err error }

func (validatorFunc) Key(Message) string { return "v" }
func (v validatorFunc) Validate() error  { return v.err }

func TestStrategiesDeriveTheirKeysFromTheMessage(t *testing.T) {
	msg := Raw{
		Headers: map[string]string{
			"Nats-Msg-Id":      "msg-1",
			"Idempotency-Key":  "idem-1",
			"X-Correlation-Id": "xcorr",
			"a":                "a|b",
			"b":                "c",
			"c":                "a",
			"d":                "b|c",
			"bin":              "\x00\xff:1",
		},
		Body: []byte("hello"),
	}
	tests := []struct {
		name string
		s    Strategy
		m    Message
		want string
	}{
		{"header", Header("Nats-Msg-Id"), msg, "msg-1"},
		{"header absent", Header("Missing"), msg, ""},
		{"header case-sensitive in Raw", Header("nats-msg-id"), msg, ""},
		{"header empty name", Header(""), msg, ""},
		{"header binary value returned raw", Header("bin"), msg, "\x00\xff:1"},
		{"header nil message", Header("Nats-Msg-Id"), nil, ""},
		{"header zero Raw", Header("Nats-Msg-Id"), Raw{}, ""},

		{"correlation falls back to X-", CorrelationID(), msg, "xcorr"},
		{"correlation prefers Correlation-Id", CorrelationID(),
			Raw{Headers: map[string]string{"Correlation-Id": "c1", "X-Correlation-Id": "c2"}}, "c1"},
		{"correlation none", CorrelationID(), Raw{}, ""},
		{"correlation nil message", CorrelationID(), nil, ""},

		{"composite", Composite(Header("a"), Header("b")), msg, "3:a|b1:c"},
		{"composite other split", Composite(Header("c"), Header("d")), msg, "1:a3:b|c"},
		{"composite one part", Composite(Header("Nats-Msg-Id")), msg, "5:msg-1"},
		{"composite nested", Composite(Composite(Header("b")), Header("c")), msg, "3:1:c1:a"},
		{"composite binary part", Composite(Header("bin")), msg, "4:\x00\xff:1"},
		{"composite empty part", Composite(Header("a"), Header("Missing")), msg, ""},
		{"composite no parts", Composite(), msg, ""},
		{"composite nil part", Composite(Header("a"), nil), msg, ""},
		{"composite nil message", Composite(Header("a")), nil, ""},

		{"payload", Payload(), msg, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"},
		{"payload empty", Payload(), Raw{Body: []byte{}}, ""},
		{"payload nil", Payload(), Raw{}, ""},
		{"payload nil message", Payload(), nil, ""},

		{"custom", Custom(func(m Message) string { return "x" + m.Header("b") }), msg, "xc"},
		{"custom nil func", Custom(nil), msg, ""},

		{"firstof first", FirstOf(Header("Nats-Msg-Id"), Header("Idempotency-Key")), msg, "msg-1"},
		{"firstof falls through", FirstOf(Header("Missing"), nil, Header("Idempotency-Key")), msg, "idem-1"},
		{"firstof none", FirstOf(Header("Missing"), Payload()), Raw{}, ""},
		{"firstof empty", FirstOf(), msg, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.Key(tt.m); got != tt.want {
				t.Errorf("Key() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestStrategyValidateNamesTheMisconfiguredPart(t *testing.T) {
	userErr := errors.New("user: bad config")
	tests := []struct {
		name    string
		s       Strategy
		wantErr string // "" means valid
	}{
		{"header", Header("Nats-Msg-Id"), ""},
		{"header empty", Header(""), "keys: invalid: Header: empty header name"},
		{"custom", Custom(func(Message) string { return "" }), ""},
		{"custom nil", Custom(nil), "keys: invalid: Custom: nil func"},
		{"composite", Composite(Header("a"), Payload(), CorrelationID()), ""},
		{"composite empty", Composite(), "keys: invalid: Composite: no strategies"},
		{"composite nil part", Composite(Header("a"), nil), "keys: invalid: Composite: strategy 1 is nil"},
		{"composite bad part", Composite(Header("a"), Header("")),
			"keys: Composite: strategy 1: keys: invalid: Header: empty header name"},
		{"composite nested bad part", Composite(FirstOf(Custom(nil))),
			"keys: Composite: strategy 0: keys: FirstOf: strategy 0: keys: invalid: Custom: nil func"},
		{"composite user error", Composite(validatorFunc{userErr}),
			"keys: invalid: Composite: strategy 0: user: bad config"},
		{"firstof", FirstOf(Header("a"), Payload()), ""},
		{"firstof empty", FirstOf(), "keys: invalid: FirstOf: no strategies"},
		{"firstof nil", FirstOf(nil), "keys: invalid: FirstOf: strategy 0 is nil"},
		{"firstof bad member", FirstOf(Header("a"), Custom(nil)),
			"keys: FirstOf: strategy 1: keys: invalid: Custom: nil func"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, ok := tt.s.(Validator)
			if !ok {
				t.Fatalf("%T does not implement Validator", tt.s)
			}
			err := v.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %q", tt.wantErr)
			}
			if err.Error() != tt.wantErr {
				t.Errorf("Validate() = %q, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
		})
	}
	if err := Composite(validatorFunc{userErr}).(Validator).Validate(); !errors.Is(err, userErr) {
		t.Errorf("Validate() = %v, want it to wrap the member's error too", err)
	}
}

// Strategies that cannot be misconfigured do not pretend to validate.
func TestStrategiesThatCannotBeMisconfiguredDoNotValidate(t *testing.T) {
	for _, s := range []Strategy{Payload(), CorrelationID()} {
		if _, ok := s.(Validator); ok {
			t.Errorf("%T implements Validator", s)
		}
	}
}

// Composite and FirstOf copy their argument slices.
func TestCompositeAndFirstOfCopyTheirArguments(t *testing.T) {
	msg := Raw{Headers: map[string]string{"a": "1", "b": "2"}}
	parts := []Strategy{Header("a"), Header("b")}
	c, f := Composite(parts...), FirstOf(parts...)
	parts[0] = nil
	if got := c.Key(msg); got != "1:11:2" {
		t.Errorf("Composite after caller mutation = %q, want %q", got, "1:11:2")
	}
	if got := f.Key(msg); got != "1" {
		t.Errorf("FirstOf after caller mutation = %q, want %q", got, "1")
	}
}

func TestStrategiesKeepAHugeInputWholeUntilNormalized(t *testing.T) {
	big := strings.Repeat("\x00|:~{} \n\xff", 1<<17) // ~1.2 MB
	msg := Raw{Headers: map[string]string{"h": big}, Body: []byte(big)}
	if got := Header("h").Key(msg); got != big {
		t.Errorf("Header returned %d bytes, want the raw %d", len(got), len(big))
	}
	c := Composite(Header("h"), Header("h")).Key(msg)
	if want := len(big)*2 + 2*(len("1245184")+1); len(c) != want {
		t.Errorf("Composite returned %d bytes, want %d", len(c), want)
	}
	if got := Payload().Key(msg); len(got) != 64 {
		t.Errorf("Payload returned %d bytes, want 64", len(got))
	}
	if got := Normalize(c); len(got) != 65 || got[0] != '~' {
		t.Errorf("Normalize(huge) = %q, want the 65-byte hashed form", got)
	}
}

// Payload must not modify the message's data.
func TestPayloadDoesNotModifyTheMessageData(t *testing.T) {
	body := []byte("payload\x00\xff")
	orig := string(body)
	Payload().Key(Raw{Body: body})
	if string(body) != orig {
		t.Errorf("Payload modified Data(): %q, want %q", body, orig)
	}
}

func TestStrategyIsSafeForConcurrentUse(t *testing.T) {
	s := FirstOf(Header("Missing"), Composite(Header("a"), Payload()))
	msg := Raw{Headers: map[string]string{"a": "x"}, Body: []byte("hello")}
	want := s.Key(msg)
	done := make(chan string)
	for range 8 {
		go func() {
			var got string
			for range 100 {
				got = s.Key(msg)
			}
			done <- got
		}()
	}
	for range 8 {
		if got := <-done; got != want {
			t.Errorf("concurrent Key() = %q, want %q", got, want)
		}
	}
}
