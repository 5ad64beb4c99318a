package pgxtx

import "context"

// SweepOnce runs one sweep statement, for the test that each deletes at most batch
// rows.
func (t *Transactor) SweepOnce(ctx context.Context, batch int) (int, error) {
	return t.sweepBatch(ctx, batch)
}
