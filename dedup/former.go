package dedup

import (
	"fmt"
	"slices"

	"github.com/dedupkit/dedupkit/keys"
)

// WithFormerNames lists the names the handler had before a rename, so that their
// records still count (docs/design.md §11): a key new under the handler's name is
// looked up under the former names in one more round trip, and a DONE record there
// answers Duplicate (and is copied forward), one IN PROGRESS as such a record does. New
// records are written under the current name only; Lookup and Forget cover the
// former names too. Default: none. Register refuses, wrapping ErrInvalidOption, an
// invalid or repeated name, the handler's own name, a name or former name of another
// handler, and a store that does not implement RecordStore. Drop a former name once
// a retention has passed since the rename. See docs/operating.md.
func WithFormerNames(names ...string) HandlerOption {
	return func(c *handlerConfig) error {
		for i, n := range names {
			if err := keys.ValidateName(n); err != nil {
				return fmt.Errorf("%w: former name: %w", ErrInvalidOption, err)
			}
			if slices.Contains(names[:i], n) {
				return fmt.Errorf("%w: former name %q is given twice", ErrInvalidOption, n)
			}
		}
		c.formerNames = slices.Clone(names)
		return nil
	}
}

// checkFormerNames refuses names h shares with itself or another handler; d.mu held.
func (d *Deduper) checkFormerNames(h *Handler) error {
	for _, n := range h.cfg.formerNames {
		if n == h.name {
			return fmt.Errorf("%w: handler %q: former name %q is its own name", ErrInvalidOption, h.name, n)
		}
	}
	for _, o := range d.handlers {
		if slices.Contains(o.cfg.formerNames, h.name) {
			return fmt.Errorf("%w: handler %q: it is a former name of handler %q", ErrInvalidOption, h.name, o.name)
		}
		for _, n := range h.cfg.formerNames {
			if n == o.name || slices.Contains(o.cfg.formerNames, n) {
				return fmt.Errorf("%w: handler %q: former name %q is a name of handler %q", ErrInvalidOption, h.name, n, o.name)
			}
		}
	}
	return nil
}
