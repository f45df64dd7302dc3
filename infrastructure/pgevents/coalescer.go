package pgevents

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/coalesce"
)

// Coalescing limits: a batch takes no more joiners once it holds this many
// events or appends (an append larger than the limit still runs, alone).
const (
	maxBatchEvents  = 1000
	maxBatchAppends = 64
)

// appendCoalescer lets concurrent Postgres appends of one store share one
// transaction: one append lock, one commit and one WAL flush. A
// transaction is sent to the database in one round trip (see
// appendBatchOnce), so its membership is fixed when it is sent. At most
// two batches of a store are in flight at once (one holding the append
// lock, one queued on it in the database), one while other stores append
// to the table too or the store's appends crowd into shared batches
// (limit); an append that finds them all busy joins the batch that forms
// behind them, which is sent as soon as one of them ends and the writers
// that batch woke had their turn to join (regather). An uncontended
// append is sent at once, alone. So the coalescing window is the time an
// append would have queued for the lock anyway.
//
// Each append keeps its own outcome: its version check, its event-ID
// checks and its validation are its own, and a conflict fails only that
// append (see appendBatchOnce). The soundness argument of the ordered feed
// is unchanged: a batch is one append transaction, whose rows take their
// positions under the lock.
//
// It is safe for concurrent use. An append sent at once runs on its
// caller's goroutine (runAlone); a formed batch runs on a goroutine that
// ends when no formed batch is left to send. A shared batch's database
// work is cancelled only once every member's context is done, so one
// caller's cancellation never fails the appends it shares a batch with.
type appendCoalescer struct {
	mu       sync.Mutex
	inFlight int
	forming  []*appendBatch // in order; appends join the last one they can
	// lastEnd is the feed head after the latest of this store's committed
	// batches (0: none seen yet); shared is set when the latest batch
	// found rows appended after lastEnd by others (see observe).
	lastEnd int64
	shared  bool
	// crowded is set when an append found the store's slots busy and
	// formed or joined a batch behind them, cleared when one is sent at
	// once or every append of the store was answered (see limit).
	crowded bool
	// solo sends every append alone, in its own transaction (set before
	// the first append: Appender.SetCoalescing), as coalesce.Disabled
	// does for every store of the process.
	solo bool
}

// maxInFlight: one batch holding the lock and one queued on it, so that
// the next transaction starts the moment the lock is released. When other
// stores (other processes) append too, the limit is 1: see limit.
const maxInFlight = 2

// limit is the number of batches the store keeps in flight. With the
// append lock to itself and its appends coming one at a time, two: the
// lock is never idle for a round trip to the client. When others append
// between its batches (shared), one: the lock is kept busy by the
// others' transactions meanwhile, and the store's appends gather into one
// larger batch (one flush) instead of two queued in the database, each
// waiting for the lock and paying its own flush. When its own appends
// crowd (the latest found the slots busy), one too: every transaction
// holds the lock through its commit's WAL flush, so two in flight split
// the writers into three groups (one holding the lock, one queued, one
// forming), each paying a flush, where one in flight lets nearly all of
// them share each flush (regather), for the price of the lock idling for
// a round trip between transactions, which on a disk that honours a
// flush takes less than the flush. The caller holds c.mu.
func (c *appendCoalescer) limit() int {
	if coalesce.FixedInFlight.Load() {
		return maxInFlight
	}
	if c.shared || c.crowded {
		return 1
	}
	return maxInFlight
}

// observe records a committed batch of the store that numbered the rows
// after start up to end (positions start+1..end): when start is past the
// end of the store's previous batch, another store appended in between.
// Batches are normally observed in lock order. One observed before an
// earlier batch of the store (whose goroutine was slow) is taken for
// another store's rows in between, which the next batch corrects; the
// earlier one, observed last (start behind lastEnd), decides nothing. It
// is safe for concurrent use.
func (c *appendCoalescer) observe(start, end int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastEnd > 0 && start >= c.lastEnd {
		c.shared = start > c.lastEnd
	}
	c.lastEnd = max(c.lastEnd, end)
}

// appendRequest is one Append call in a batch.
type appendRequest struct {
	ctx             context.Context
	aggregateID     string
	expectedVersion int
	events          []domain.EventEnvelope[any] // without payloads and metadata: see prepared
	prepared        []Prepared                  // validated and encoded by the store's Append
	done            chan error                  // buffered: the batch's result for this append
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
	closed  bool // sent or about to be: membership is final
	aggs    map[string]bool
	ids     map[string]bool
}

func newAppendBatch(first *appendRequest) *appendBatch {
	ctx, cancel := context.WithCancel(context.WithoutCancel(first.ctx))
	b := &appendBatch{ctx: ctx, cancel: cancel, aggs: map[string]bool{}, ids: map[string]bool{}}
	b.add(first)
	return b
}

// run submits req and waits for its outcome. runBatch does a closed
// batch's database work and must deliver one result to every member's
// done.
func (c *appendCoalescer) run(req *appendRequest, runBatch func(*appendBatch)) error {
	if err := req.ctx.Err(); err != nil {
		return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(req.events), req.aggregateID, context.Cause(req.ctx))
	}
	req.done = make(chan error, 1)
	solo := c.solo || coalesce.Disabled.Load()
	c.mu.Lock()
	var b *appendBatch
	if n := len(c.forming); n > 0 && !solo && c.forming[n-1].canJoin(req) {
		b = c.forming[n-1]
		b.add(req)
		c.crowded = true
		c.mu.Unlock()
	} else if solo || (len(c.forming) == 0 && c.inFlight < c.limit()) {
		// Sent at once, alone: on the caller's goroutine, under the
		// caller's context (see runAlone).
		// Closed from the start: nobody joins it, so it needs no index
		// of its aggregates and event IDs (add).
		b = &appendBatch{ctx: req.ctx, cancel: func() {}, closed: true}
		b.add(req)
		if !solo {
			c.inFlight++
			c.crowded = false
		}
		c.mu.Unlock()
		return c.runAlone(req, b, runBatch, !solo)
	} else {
		b = newAppendBatch(req)
		c.forming = append(c.forming, b)
		c.crowded = true
		c.mu.Unlock()
	}
	select {
	case err := <-req.done:
		return err
	case <-req.ctx.Done():
		// Both may be ready at once, and select picks at random: an
		// outcome that arrived is the answer.
		select {
		case err := <-req.done:
			return err
		default:
		}
	}
	c.mu.Lock()
	removed := !b.closed && b.remove(req)
	if removed && len(b.members) == 0 {
		c.forming = slices.DeleteFunc(c.forming, func(f *appendBatch) bool { return f == b })
		b.cancel()
	} else if b.closed && b.allDone() {
		// Nobody waits for this batch any more: stop its database work.
		b.cancel()
	}
	c.mu.Unlock()
	if removed {
		return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(req.events), req.aggregateID, context.Cause(req.ctx))
	}
	// The batch carries this append: it may still commit (see the
	// README's advice on retries).
	return fmt.Errorf("append %d event(s) to aggregate %q: gave up waiting for the commit, which may still succeed: %w", len(req.events), req.aggregateID, context.Cause(req.ctx))
}

// runAlone runs the batch b of req alone on the caller's goroutine: an
// uncontended append is not handed to another goroutine and back, which
// costs a lone append scheduler wake-ups on its path. b's context is the
// caller's (req is its only member and nobody can join it), so the
// caller's cancellation stops the database work at once, as the last
// member's does for a shared batch. An outcome the batch delivered
// stands; a failure after the caller's context ended is reported as the
// caller having given up, since the commit may have been under way. When
// batches formed behind b meanwhile, the slot passes to a goroutine that
// sends them (send), and the caller returns.
func (c *appendCoalescer) runAlone(req *appendRequest, b *appendBatch, runBatch func(*appendBatch), counted bool) error {
	runBatch(b)
	if counted {
		if next := c.next(runBatch); next != nil {
			go c.send(next, runBatch)
		}
	}
	err := <-req.done
	if err == nil || req.ctx.Err() == nil || definite(err) {
		return err
	}
	return fmt.Errorf("append %d event(s) to aggregate %q: gave up waiting for the commit, which may still succeed: %w (%v)", len(req.events), req.aggregateID, context.Cause(req.ctx), err)
}

// definite reports an outcome that does not depend on whether the
// transaction committed: the append's own refusal.
func definite(err error) bool {
	return errors.Is(err, domain.ErrConcurrencyConflict) || errors.Is(err, domain.ErrAlreadyAppended) || errors.Is(err, domain.ErrInvalidEvent)
}

// send runs b, a formed batch holding an in-flight slot, and then, while
// batches have formed behind it, the oldest of them, on the same
// goroutine, which ends when the slot is freed (next).
func (c *appendCoalescer) send(b *appendBatch, runBatch func(*appendBatch)) {
	for b != nil {
		runBatch(b)
		if len(b.members) > 1 {
			c.regather()
		}
		b = c.next(runBatch)
	}
}

// regather runs after a shared batch delivered its members' outcomes and
// before its in-flight slot sends the next batch: it yields the processor
// (runtime.Gosched) until appends joined the batches forming and stopped
// coming, a few times at most, so that the writers the commit woke
// together append again in the next transaction rather than in one
// behind it. The slot is still held meanwhile, so they join a forming
// batch. A lone append never waits for it (runAlone).
func (c *appendCoalescer) regather() {
	const maxYields = 4
	waiting := 0
	for range maxYields {
		runtime.Gosched()
		c.mu.Lock()
		n := 0
		for _, f := range c.forming {
			n += len(f.members)
		}
		c.mu.Unlock()
		if n > 0 && n == waiting {
			return // they came, and no more are coming
		}
		waiting = n
	}
}

// next closes and returns the oldest formed batch, to be sent on the
// in-flight slot of a batch that just ended; nil when none formed or the
// limit fell below the batches in flight, the slot then freed. When the
// limit rose, formed batches beyond this one are sent on new slots.
func (c *appendCoalescer) next(runBatch func(*appendBatch)) *appendBatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.forming) == 0 && c.inFlight == 1 {
		c.crowded = false // the store's appends are all answered
	}
	limit := c.limit()
	if len(c.forming) == 0 || c.inFlight > limit {
		c.inFlight--
		return nil
	}
	b := c.takeFormed()
	for len(c.forming) > 0 && c.inFlight < limit {
		c.inFlight++
		go c.send(c.takeFormed(), runBatch)
	}
	return b
}

// takeFormed closes the oldest formed batch and returns it. The caller
// holds c.mu.
func (c *appendCoalescer) takeFormed() *appendBatch {
	b := c.forming[0]
	c.forming = c.forming[1:]
	b.closed = true
	if b.allDone() {
		b.cancel()
	}
	return b
}

// canJoin: a batch takes no two appends to one aggregate and no shared
// event ID, so that a refused member never depends on another member of
// its own transaction (a retry's outcome, a conflict's explanation), and
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
	if b.aggs == nil {
		return // a batch sent at once, closed from the start
	}
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
