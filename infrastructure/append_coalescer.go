package infrastructure

import (
	"context"
	"fmt"
	"sync"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/coalesce"
)

// Coalescing limits: a batch takes no more joiners once it holds this many
// events or appends (an append larger than the limit still runs, alone).
const (
	maxBatchEvents  = insertChunk
	maxBatchAppends = 64
)

// appendCoalescer lets concurrent Postgres appends of one store share one
// transaction: one append lock, one round trip of inserts, one commit and
// one WAL flush. An append that finds a batch still waiting for the append
// lock joins it; otherwise it starts a batch. A batch closes the moment the
// lock is granted, so the coalescing window is exactly the time a batch
// would have queued anyway, and an uncontended append runs alone.
//
// Each append keeps its own outcome: its version check, its event-ID
// checks and its validation are its own, and a conflict fails only that
// append (see appendBatchOnce). The soundness argument of the ordered feed
// is unchanged: a batch is one append transaction, under the lock, whose
// rows take the positions after the head read under the lock.
//
// It is safe for concurrent use. Each batch runs on a goroutine of its
// own, which ends with the batch; a batch's database work is cancelled
// only once every member's context is done, so one caller's cancellation
// never fails the appends it shares a batch with.
type appendCoalescer struct {
	mu      sync.Mutex
	forming *appendBatch // the batch waiting for the lock that appends join; nil if none
}

// appendRequest is one Append call in a batch.
type appendRequest struct {
	ctx             context.Context
	aggregateID     string
	expectedVersion int
	events          []domain.EventEnvelope[any]
	done            chan error // buffered: the batch's result for this append
}

// appendBatch is the appends that share one transaction. members and
// closed are guarded by the coalescer's mutex until closed is set; after
// that members is read-only.
type appendBatch struct {
	ctx    context.Context
	cancel context.CancelFunc
	// members in arrival order; their positions follow that order.
	members []*appendRequest
	events  int
	closed  bool // the lock is granted: membership is final
	aggs    map[string]bool
	ids     map[string]bool
}

// run submits req and waits for its outcome. runBatch does a batch's
// database work and must deliver one result to every member's done.
func (c *appendCoalescer) run(req *appendRequest, runBatch func(*appendBatch)) error {
	req.done = make(chan error, 1)
	solo := coalesce.Disabled.Load()
	c.mu.Lock()
	b := c.forming
	if b == nil || solo || !b.canJoin(req) {
		ctx, cancel := context.WithCancel(context.WithoutCancel(req.ctx))
		b = &appendBatch{ctx: ctx, cancel: cancel, aggs: map[string]bool{}, ids: map[string]bool{}}
		if c.forming == nil && !solo {
			c.forming = b
		}
		b.add(req)
		c.mu.Unlock()
		go runBatch(b)
	} else {
		b.add(req)
		c.mu.Unlock()
	}
	select {
	case err := <-req.done:
		return err
	case <-req.ctx.Done():
	}
	c.mu.Lock()
	removed := !b.closed && b.remove(req)
	if b.allDone() {
		// Nobody waits for this batch any more: stop its database work,
		// and let no one join it.
		if c.forming == b {
			c.forming = nil
		}
		b.closed = b.closed || len(b.members) == 0
		b.cancel()
	}
	c.mu.Unlock()
	if removed {
		return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(req.events), req.aggregateID, context.Cause(req.ctx))
	}
	// The batch holds the lock and carries this append: it may still
	// commit (see the README's advice on retries).
	return fmt.Errorf("append %d event(s) to aggregate %q: gave up waiting for the commit, which may still succeed: %w", len(req.events), req.aggregateID, context.Cause(req.ctx))
}

// close is called by the batch once the append lock is granted: it
// returns the final members, and later appends start a new batch.
func (c *appendCoalescer) close(b *appendBatch) []*appendRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	b.closed = true
	if c.forming == b {
		c.forming = nil
	}
	return b.members
}

// canJoin: a batch takes no two appends to one aggregate and no shared
// event ID, so that each member's checks read only committed state, and
// stays under the size limits.
func (b *appendBatch) canJoin(req *appendRequest) bool {
	if b.closed || b.aggs[req.aggregateID] || len(b.members) >= maxBatchAppends ||
		b.events+len(req.events) > maxBatchEvents {
		return false
	}
	for _, ev := range req.events {
		if b.ids[ev.ID] {
			return false
		}
	}
	return true
}

func (b *appendBatch) add(req *appendRequest) {
	b.members = append(b.members, req)
	b.events += len(req.events)
	b.aggs[req.aggregateID] = true
	for _, ev := range req.events {
		b.ids[ev.ID] = true
	}
}

// remove takes a member out of a batch that is not closed yet.
func (b *appendBatch) remove(req *appendRequest) bool {
	for i, m := range b.members {
		if m == req {
			b.members = append(b.members[:i:i], b.members[i+1:]...)
			b.events -= len(req.events)
			delete(b.aggs, req.aggregateID)
			for _, ev := range req.events {
				delete(b.ids, ev.ID)
			}
			return true
		}
	}
	return false
}

// allDone reports that no member waits for the batch any more.
func (b *appendBatch) allDone() bool {
	for _, m := range b.members {
		if m.ctx.Err() == nil {
			return false
		}
	}
	return true
}
