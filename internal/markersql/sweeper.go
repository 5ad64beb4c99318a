package markersql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// CheckSweep validates a sweeper's period and batch size (WithSweep).
func CheckSweep(every time.Duration, batch int) error {
	if every <= 0 {
		return fmt.Errorf("sweep period %v: want more than 0", every)
	}
	return CheckBatch(batch)
}

// MaxBatch bounds the rows one sweep statement deletes: the statement's locks and
// undo are held until it ends.
const MaxBatch = 100_000

// CheckBatch validates a sweep's batch size.
func CheckBatch(batch int) error {
	if batch < 1 || batch > MaxBatch {
		return fmt.Errorf("sweep batch %d: want 1 to %d", batch, MaxBatch)
	}
	return nil
}

// Sweep runs once (one statement deleting at most batch rows, returning how many)
// until a run deletes fewer than batch rows or ctx ends.
func Sweep(ctx context.Context, batch int, once func(ctx context.Context, batch int) (int, error)) (int, error) {
	if err := CheckBatch(batch); err != nil {
		return 0, err
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := once(ctx, batch)
		total += n
		if err != nil {
			return total, errors.Join(err, ctx.Err())
		}
		if n < batch {
			return total, nil
		}
	}
}

// Sweeper runs a sweep every period on one goroutine until Stop.
type Sweeper struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// StartSweeper starts the goroutine. sweep errors are logged at Warn (what fails
// is the database: the next period tries again), except for the cancellation Stop
// causes.
func StartSweeper(every time.Duration, batch int, sweep func(ctx context.Context, batch int) (int, error), log *slog.Logger, pkg string) *Sweeper {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sweeper{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n, err := sweep(ctx, batch); err != nil && ctx.Err() == nil {
				log.Warn(pkg+": sweeping expired markers failed", "deleted", n, "err", err)
			}
		}
	}()
	return s
}

// Stop stops the goroutine, cancelling a sweep in flight, and waits for it to end.
// It is safe to call more than once.
func (s *Sweeper) Stop() {
	s.once.Do(s.cancel)
	<-s.done
}
