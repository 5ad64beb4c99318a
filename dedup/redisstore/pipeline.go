package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

const (
	// DefaultPipelineBatch is the most commands one coalesced pipeline carries.
	DefaultPipelineBatch = 128
	// DefaultPipelinesInFlight is how many round trips go at once before calls queue.
	DefaultPipelinesInFlight = 4
)

// WithAutoPipeline sets how concurrent calls of one entry share round trips: up to
// inFlight go at once; calls beyond that queue, and go as one pipeline of up to batch
// commands when one ends (no timer). Defaults: DefaultPipelineBatch and
// DefaultPipelinesInFlight; batch must be 1..10000, inFlight 1..1024.
func WithAutoPipeline(batch, inFlight int) Option {
	return func(s *Store) error {
		if batch < 1 || batch > 10000 {
			return fmt.Errorf("%w: auto-pipeline batch %d is outside 1..10000", driver.ErrInvalidOption, batch)
		}
		if inFlight < 1 || inFlight > 1024 {
			return fmt.Errorf("%w: auto-pipeline round trips in flight %d is outside 1..1024", driver.ErrInvalidOption, inFlight)
		}
		s.pipe = newAutoPipe(s, batch, inFlight)
		return nil
	}
}

// WithoutAutoPipeline sends every call of one entry as its own command: each
// concurrent caller holds a pooled connection for a round trip.
func WithoutAutoPipeline() Option {
	return func(s *Store) error {
		s.pipe = nil
		return nil
	}
}

// autoPipe coalesces concurrent callers' commands into pipelines. A caller that finds
// a free slot and an empty queue sends its own; otherwise it queues for a flusher,
// which exits once the queue is empty: there is nothing to close.
type autoPipe struct {
	s        *Store // sends each round trip (process, exec)
	batch    int
	inFlight int

	mu       sync.Mutex
	queue    []*pcall
	spare    []*pcall // the other half of a double buffer for queue
	flushers int      // round trips outstanding: inline senders and flushers
}

// pcall is one queued command. done receives once, when cmd holds its reply or was
// skipped (its ctx ended). sent, under autoPipe.mu, says a flusher took it: its
// caller then waits for the reply.
type pcall struct {
	ctx  context.Context
	cmd  redis.Cmder
	done chan struct{}
	sent bool
	// comp is a Complete's entry (doComplete): a flush may merge it into complete_many
	comp *driver.Entry
}

var pcallPool = sync.Pool{New: func() any { return &pcall{done: make(chan struct{}, 1)} }}

func newAutoPipe(s *Store, batch, inFlight int) *autoPipe {
	return &autoPipe{s: s, batch: batch, inFlight: inFlight}
}

// do sends cmd and returns its error. A call still queued when ctx ends is never
// sent; one already sent waits for its reply whatever ctx says, since a Mark that
// lands after its caller reported a failure would make the redelivery a duplicate.
func (p *autoPipe) do(ctx context.Context, cmd redis.Cmder) error {
	return p.doComplete(ctx, cmd, nil)
}

// doComplete is do for comp's complete script: a flush may merge it into complete_many.
func (p *autoPipe) doComplete(ctx context.Context, cmd redis.Cmder, comp *driver.Entry) error {
	p.mu.Lock()
	if len(p.queue) == 0 && p.flushers < p.inFlight {
		p.flushers++
		p.mu.Unlock()
		defer p.release() // also when Process panics: the slot must come back
		_ = p.s.process(ctx, cmd)
		return cmd.Err()
	}
	c := p.enqueue(ctx, cmd)
	c.comp = comp
	p.spawnLocked()
	return p.await(ctx, c)
}

// doAll is do for several commands, each holding its reply or error; its error is
// the round trip's when it sent them itself, else nil.
func (p *autoPipe) doAll(ctx context.Context, cmds ...redis.Cmder) error {
	p.mu.Lock()
	if len(p.queue) == 0 && p.flushers < p.inFlight {
		p.flushers++
		p.mu.Unlock()
		defer p.release()
		return p.s.exec(ctx, cmds...)
	}
	calls := make([]*pcall, len(cmds))
	for i, cmd := range cmds {
		calls[i] = p.enqueue(ctx, cmd)
	}
	p.spawnLocked()
	for i, c := range calls {
		if err := p.await(ctx, c); err != nil && cmds[i].Err() == nil {
			cmds[i].SetErr(err) // never sent
		}
	}
	return nil
}

// enqueue queues cmd. Called with p.mu held.
func (p *autoPipe) enqueue(ctx context.Context, cmd redis.Cmder) *pcall {
	c := pcallPool.Get().(*pcall)
	c.ctx, c.cmd = ctx, cmd
	p.queue = append(p.queue, c)
	return c
}

// spawnLocked starts a flusher if a round trip is free; it unlocks p.mu.
func (p *autoPipe) spawnLocked() {
	spawn := p.flushers < p.inFlight
	if spawn {
		p.flushers++
	}
	p.mu.Unlock()
	if spawn {
		go p.flush()
	}
}

// await returns c's error, or ctx's cause if ctx ended while c was queued (unsent).
func (p *autoPipe) await(ctx context.Context, c *pcall) error {
	cmd := c.cmd
	select {
	case <-c.done:
	case <-ctx.Done():
		if p.unqueue(c) {
			c.ctx, c.cmd, c.comp = nil, nil, nil
			pcallPool.Put(c)
			return context.Cause(ctx)
		}
		<-c.done // in a round trip already: its reply decides
	}
	c.ctx, c.cmd, c.sent, c.comp = nil, nil, false, nil
	pcallPool.Put(c)
	return cmd.Err()
}

// unqueue takes c out of the queue if no flusher has taken it yet.
func (p *autoPipe) unqueue(c *pcall) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.sent {
		return false
	}
	if i := slices.Index(p.queue, c); i >= 0 {
		p.queue = slices.Delete(p.queue, i, i+1)
	}
	return true
}

// release gives back an inline sender's slot, or makes it a flusher for the queue.
func (p *autoPipe) release() {
	p.mu.Lock()
	if len(p.queue) > 0 {
		p.mu.Unlock()
		go p.flush()
		return
	}
	p.flushers--
	p.mu.Unlock()
}

// flush sends the queue until it is empty, then gives back its slot.
func (p *autoPipe) flush() {
	var batch []*pcall
	for {
		p.mu.Lock()
		n := len(p.queue)
		if n == 0 {
			p.flushers--
			p.spare = batch[:0]
			p.mu.Unlock()
			return
		}
		if n <= p.batch {
			// take the whole queue, leaving an empty buffer in its place
			next := batch[:0]
			if next == nil {
				next, p.spare = p.spare, nil
			}
			batch, p.queue = p.queue, next
		} else {
			batch = append(batch[:0], p.queue[:p.batch]...)
			k := copy(p.queue, p.queue[p.batch:])
			clear(p.queue[k:])
			p.queue = p.queue[:k]
		}
		for _, c := range batch {
			c.sent = true
		}
		p.mu.Unlock()
		p.send(batch)
		clear(batch)
	}
}

// send runs one batch: one command alone, several as a pipeline. Calls whose ctx
// ended are answered unsent.
func (p *autoPipe) send(batch []*pcall) {
	live := 0
	var deadline time.Time
	bounded := true
	for _, c := range batch {
		if c.ctx.Err() != nil {
			c.cmd.SetErr(context.Cause(c.ctx))
			c.done <- struct{}{}
			continue
		}
		batch[live] = c
		live++
		if d, ok := c.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(deadline) {
			deadline = d
		}
	}
	batch = batch[:live]
	switch len(batch) {
	case 0:
		return
	case 1:
		_ = p.s.process(batch[0].ctx, batch[0].cmd)
	default:
		// one caller's ctx must not fail the others' commands: the pipeline runs to the
		// last deadline among them, or the client's timeouts if one has none
		ctx := context.Background()
		if bounded {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		cmds := make([]redis.Cmder, 0, len(batch))
		var comps []*pcall
		merge := p.s.batchScriptsKnown() // not if a refusal turned the scripts off meanwhile
		for _, c := range batch {
			if c.comp != nil && merge {
				comps = append(comps, c)
			} else {
				cmds = append(cmds, c.cmd)
			}
		}
		if len(comps) == 1 { // nothing to merge it with
			cmds, comps = append(cmds, comps[0].cmd), nil
		}
		var merged []*redis.Cmd
		if len(comps) > 0 {
			entries := make([]driver.Entry, len(comps))
			for i, c := range comps {
				entries[i] = *c.comp
			}
			merged = completeManyCmds(ctx, entries)
			for _, m := range merged {
				cmds = append(cmds, m)
			}
		}
		_ = p.s.exec(ctx, cmds...)
		if len(comps) > 0 {
			// NOSCRIPT calls go again as EVAL
			_ = evalAgain(ctx, p.s.exec, merged, completeManyLua)
			spreadCompletes(merged, comps)
		}
	}
	for _, c := range batch {
		c.done <- struct{}{}
	}
}
