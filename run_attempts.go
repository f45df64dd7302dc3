package subscriptions

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions/domain"
)

// countAttempt counts the attempt batch is about to make at events (the
// events after start), before any handler runs: in a write committed on
// its own (see AttemptCounter), so that an attempt that crashes the
// process counts too, and replicas and restarts continue one count.
//
// A record of an earlier attempt at the same position that did not
// complete means that attempt failed, crashed the process, or lost its
// batch. If it covered several events, which of them is to blame is
// unknown: they run again one per transaction, each counted on its own.
// If it covered the first event alone, this is its next attempt; with a
// parking lot, an event whose attempts are used up is parked here
// without running its handler again.
//
// ok is false when the batch was ended here; out is then the cycle's
// outcome.
func (r *runner) countAttempt(bctx context.Context, batch Batch, start int64, events []domain.EventEnvelope[any]) (out outcome, ok bool) {
	s := r.s
	first, last := events[0], events[len(events)-1]
	rec := AttemptRecord{Position: start, EventID: first.ID, Through: last.Position, Attempts: 1, Holder: r.holder}
	r.attemptN, r.clearOnCommit = 1, false
	if p := r.pending; p != nil && last.Position < p.position {
		// The events before one that failed in this runner's last batch:
		// they commit now, and the failed event's first attempt is
		// recorded for the position they commit, before any replica can
		// attempt it there.
		// The record of the commit this batch is about to make: claimed,
		// so that a replica that takes the checkpoint before the commit
		// (where the store releases it for the batch's record write) does
		// not replace it (see AttemptCounter); the commit releases it.
		pending := AttemptRecord{Position: last.Position, EventID: p.eventID, Through: p.position, Attempts: 1, LastError: p.err.Error(), Holder: r.holder}
		if err := s.attempts.PutAttempt(bctx, batch, s.name, pending); err != nil {
			return r.attemptNotCounted(batch, first, err), false
		}
		r.wrote = pending
		return 0, true
	}
	r.clean = false
	if start == r.ownedAt && r.pending == nil && start >= r.isolateUntil {
		// This runner committed the checkpoint to start itself, in a batch
		// with no failure. Unless another replica's attempt from here left
		// a record (a read in the batch's transaction, no commit), the
		// committed record is skipped, to keep its round trip and flush off
		// the steady path (the wake latency). The price: an event that
		// kills the process in such a batch runs once uncounted; every
		// attempt after that (the first batch of a restart, any retry) is
		// counted. See docs/design.md, "Attempt counts".
		has, err := s.attempts.HasAttempt(bctx, batch, s.name, start)
		if err != nil {
			return r.attemptNotCounted(batch, first, err), false
		}
		r.ownedAt = -1 // set again when this batch commits
		if !has {
			r.wrote, r.clean = AttemptRecord{}, true
			return 0, true
		}
	}
	prev, found, err := s.attempts.BeginAttempt(bctx, batch, s.name, rec)
	if err != nil {
		return r.attemptNotCounted(batch, first, err), false
	}
	own := r.wrote
	r.wrote = rec
	switch {
	case !found:
		r.clean = r.pending == nil && start >= r.isolateUntil
		return 0, true
	case prev.Attempts == 0:
		return r.afterMarker(bctx, batch, events, rec, prev)
	case !prev.single(first.Position):
		return r.afterIncomplete(bctx, batch, events, rec, prev, own)
	}
	return r.nextAttempt(bctx, batch, events, rec, prev)
}

// afterMarker is countAttempt finding a marker (prev): the event
// prev.eventID (at prev.through) failed, in a replica's batch from here,
// after the events before it had been handled. As that replica does,
// commit those events alone, and record the failure for the position they
// commit: the event's next attempt, by any replica, is its second.
func (r *runner) afterMarker(bctx context.Context, batch Batch, events []domain.EventEnvelope[any], rec, prev AttemptRecord) (outcome, bool) {
	var before int
	for before < len(events) && events[before].Position < prev.Through {
		before++
	}
	if before > 0 && before < len(events) && events[before].ID == prev.EventID {
		r.rollback(batch)
		r.prefix = before
		r.pending = &pendingFailure{eventID: prev.EventID, position: prev.Through, err: errors.New(prev.LastError)}
		return outcomeMore, false
	}
	// The batch does not reach the event (a smaller batch size): counted
	// afresh.
	return r.putAttempt(bctx, batch, events[0], rec)
}

// afterIncomplete is countAttempt finding the record of an attempt at
// several events (prev) that did not complete. This runner's own batch,
// which it saw fail (own: it is still here), is no crash: counted afresh.
// After a crash, which event is to blame is unknown: the events run one
// per transaction.
func (r *runner) afterIncomplete(bctx context.Context, batch Batch, events []domain.EventEnvelope[any], rec, prev, own AttemptRecord) (outcome, bool) {
	first := events[0]
	crashed := own.Position != prev.Position || own.EventID != prev.EventID || own.Through != prev.Through
	if crashed && len(events) > 1 {
		r.rollback(batch)
		r.isolateUntil = max(r.isolateUntil, prev.Through)
		r.s.logger.Warn("subscriber: an attempt at these events did not complete (process crashed or lost its lock?); running them one per transaction",
			"subscriber", r.s.name, "from", first.Position, "to", prev.Through)
		return outcomeMore, false
	}
	if crashed {
		r.isolateUntil = max(r.isolateUntil, prev.Through)
	}
	return r.putAttempt(bctx, batch, first, rec)
}

// nextAttempt is countAttempt finding the record of prev.attempts
// attempts at the first event alone: this is the next, alone, or, with a
// parking lot and the attempts used up, the event is parked here without
// running its handler again.
func (r *runner) nextAttempt(bctx context.Context, batch Batch, events []domain.EventEnvelope[any], rec, prev AttemptRecord) (outcome, bool) {
	s, first := r.s, events[0]
	if len(events) > 1 {
		// The first event is being retried: alone.
		r.rollback(batch)
		r.isolateUntil = max(r.isolateUntil, first.Position)
		return outcomeMore, false
	}
	n := prev.Attempts + 1
	if s.parking != nil && n > s.retry.attempts() {
		// The cause is the last failure recorded; none means every attempt
		// ended the process (or its batch) before it could fail.
		cause := prev.LastError
		if cause == "" {
			cause = fmt.Sprintf("attempted %d times without completing (process crashed or lost its lock?)", prev.Attempts)
		}
		tctx, span := s.tel.startBatch(r.drain, events[:1], prev.Attempts, trace.SpanContext{})
		out, perr := r.parkIn(tctx, bctx, batch, first, prev.Attempts, errors.New(cause))
		span.end(tctx, perr)
		return out, false
	}
	rec.Through, rec.Attempts, rec.LastError = first.Position, n, prev.LastError
	if out, ok := r.putAttempt(bctx, batch, first, rec); !ok {
		return out, false
	}
	r.wrote, r.attemptN, r.clearOnCommit = rec, n, true
	return 0, true
}

// putAttempt writes rec, the count of the attempt batch makes at ev; ok
// is false when it could not be written and the batch was ended.
func (r *runner) putAttempt(bctx context.Context, batch Batch, ev domain.EventEnvelope[any], rec AttemptRecord) (outcome, bool) {
	if err := r.s.attempts.PutAttempt(bctx, batch, r.s.name, rec); err != nil {
		return r.attemptNotCounted(batch, ev, err), false
	}
	return 0, true
}

// attemptNotCounted ends batch when its attempt could not be counted: it
// is not run uncounted.
func (r *runner) attemptNotCounted(batch Batch, ev domain.EventEnvelope[any], err error) outcome {
	if errors.Is(err, ErrCheckpointMoved) {
		r.rollback(batch)
		r.known = -1
		return outcomeMore
	}
	if errors.Is(err, ErrAttemptClaimed) {
		// Another replica is about to take the checkpoint back for its
		// attempt: as if it held the checkpoint.
		r.rollback(batch)
		r.known = -1
		return outcomeSkipped
	}
	r.known = -1
	return r.abandon(batch, ev, "subscriber: counting the attempt failed; will retry", err)
}

// recordFailure records that attempt n at ev (the event after start)
// failed with err, for the replica or restart that counts the next
// attempt, and ends batch, the failed attempt's (nil when it has ended),
// without letting another batch in before the record is written (see
// AttemptCounter.FailAttempt). A failure to record it is logged: the
// count stands, only the cause is lost.
func (r *runner) recordFailure(ctx context.Context, batch Batch, start int64, ev domain.EventEnvelope[any], n int, err error) {
	s := r.s
	rec := AttemptRecord{Position: start, EventID: ev.ID, Through: ev.Position, Attempts: n, LastError: err.Error(), Holder: r.holder}
	r.wrote, r.clean = rec, false
	if ferr := s.attempts.FailAttempt(context.WithoutCancel(ctx), batch, s.name, rec); ferr != nil {
		s.logger.Warn("subscriber: recording the failed attempt failed", append(s.eventAttrs(ev), "attempt", n, "error", ferr)...)
	}
}
