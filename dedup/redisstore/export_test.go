package redisstore

import (
	"context"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// ScriptFirst returns s with every Claim and Mark sent as a store whose recent claims
// and marks keep finding records sends it: straight to the claim scripts, or to SET
// NX PX GET. The conformance suite and the model run it too, so that both ways of
// claiming and of marking answer alike.
func ScriptFirst(s *Store) driver.Store { return scriptFirst{s} }

type scriptFirst struct{ *Store }

func (s scriptFirst) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	s.found.Store(foundMax)
	if !s.findsRecords() {
		panic("ScriptFirst: the store would send SET NX first")
	}
	return s.Store.Claim(ctx, entries)
}

func (s scriptFirst) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	s.found.Store(foundMax)
	if !s.findsRecords() {
		panic("ScriptFirst: the store would send SET NX PX first")
	}
	return s.Store.Mark(ctx, entries)
}
