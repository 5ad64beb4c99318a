package keys

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrInvalid is wrapped by every error that Validate, [ValidateName] and
// [ValidatePrefix] return; check it with errors.Is.
var ErrInvalid = errors.New("keys: invalid")

// invalidf returns an error reading "keys: invalid: <message>" that wraps ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// memberErr wraps a member strategy's Validate error so that it wraps
// ErrInvalid once, even when it comes from a user's Validator.
func memberErr(ctor string, i int, err error) error {
	if errors.Is(err, ErrInvalid) {
		return fmt.Errorf("keys: %s: strategy %d: %w", ctor, i, err)
	}
	return fmt.Errorf("%w: %s: strategy %d: %w", ErrInvalid, ctor, i, err)
}

// maxQuoted bounds how much of a rejected name an error repeats.
const maxQuoted = 32

// quote returns s quoted with %q semantics, truncated to maxQuoted bytes.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:maxQuoted]) + "..."
}
