package subscriptions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// outcome is what one cycle leaves the run loop to do.
type outcome int

const (
	// outcomeIdle: nothing past the checkpoint; wait for a wake or a poll.
	outcomeIdle outcome = iota
	// outcomeMore: more work is known to be waiting; cycle again at once.
	outcomeMore
	// outcomeSkipped: another replica holds the checkpoint.
	outcomeSkipped
	// outcomeFailed: a transient failure was logged; retry after a poll
	// interval, ignoring wake signals (a failing event would otherwise be
	// retried on every append).
	outcomeFailed
	// outcomeStopped: the context was cancelled outside a batch.
	outcomeStopped
	// outcomeFatal: the event store has no global ordered feed (r.fatal).
	outcomeFatal
	// outcomeBackoff: a failing event waits out its retry backoff, until
	// r.retry.at; the next cycle makes the attempt (only for a runner
	// whose deferBackoff is set: a Group's, whose workers do not wait).
	outcomeBackoff
)

// wakeRechecks are the delays of the quick re-checks after a wake signal
// that found nothing new: a notification can arrive before the commit it
// announces is visible to this process's reads, and a wasted notification
// would otherwise cost a whole poll interval.
var wakeRechecks = []time.Duration{5 * time.Millisecond, 25 * time.Millisecond, 100 * time.Millisecond}

// Run processes the feed until ctx is cancelled. A batch that is already in
// flight when cancellation arrives is drained — handlers finish and the
// checkpoint advances — before Run returns nil; WithShutdownGrace bounds
// that drain. A retry backoff in progress is cut short instead: the
// failing event is redelivered on restart.
//
// One Run at a time: while Run runs, another Run of the same Subscriber
// returns an error wrapping ErrRunning at once. After Run has returned,
// the Subscriber can be run again.
//
// Transient errors (database hiccups, handler failures) are logged and
// retried after the poll interval; they never stop the subscriber. Apart
// from ErrRunning, the only errors Run returns are fatal misconfiguration:
// an event store without a global ordered feed (an error wrapping
// domain.ErrGlobalOrderingNotSupported), or a name whose checkpoints were
// written for another partition count (ErrPartitionsChanged, also at the
// next batch or poll after a Repartition of the name).
//
// A panicking handler rolls back its batch, releasing the checkpoint, and
// the panic propagates out of Run.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("subscriptions: run %q: %w", s.name, ErrRunning)
	}
	defer s.running.Store(false)
	// Running from here on, though the start may still retry a database
	// that does not answer: Healthy and Status report a Run that is
	// starting as running (and then stuck, past the threshold), not as a
	// process that does not run the subscriber.
	s.tel.started()
	defer s.tel.setState(StateStopped)
	if s.partitions > 0 {
		return s.runPartitioned(ctx)
	}
	if _, err := s.events.HeadPosition(ctx); err != nil {
		if errors.Is(err, domain.ErrGlobalOrderingNotSupported) {
			return fmt.Errorf("subscriptions: subscriber %q cannot run: %w", s.name, err)
		}
		if ctx.Err() == nil {
			s.logger.Warn("subscriber: reading the feed head failed; will retry", "subscriber", s.name, "error", err)
		}
	}
	if s.startCatchUp(ctx) {
		return nil
	}
	s.logger.Info("subscriber started", "subscriber", s.name, "batch_size", s.batchSize, "poll_interval", s.pollInterval)
	defer s.logger.Info("subscriber stopped", "subscriber", s.name)
	defer s.tel.observe(s)()

	drain, stopDrain := s.drainContext(ctx)
	defer stopDrain()
	r := newRunner(s, s.wake, drain)
	defer r.timer.Stop()

	check := true // read the checkpoint again before the next batch
	// rechecks counts the quick re-checks done since the last wake signal;
	// -1 when no wake is being followed up.
	rechecks := -1
	for {
		if ctx.Err() != nil {
			return nil
		}
		out := r.cycle(ctx, check)
		wait, allowWake := s.pollInterval, true
		switch out {
		case outcomeStopped:
			return nil
		case outcomeFatal:
			if errors.Is(r.fatal, ErrPartitionsChanged) {
				return r.fatal // names the subscriber and the counts
			}
			return fmt.Errorf("subscriptions: subscriber %q cannot run: %w", s.name, r.fatal)
		case outcomeMore:
			check, rechecks = false, -1
			continue
		case outcomeIdle:
			check = true
			s.tel.caughtUp()
			if rechecks >= 0 && rechecks < len(wakeRechecks) {
				wait = wakeRechecks[rechecks]
				rechecks++
			} else {
				rechecks = -1
			}
		case outcomeSkipped:
			check, rechecks = true, -1
			s.tel.setState(StateIdle)
		case outcomeFailed:
			check, allowWake, rechecks = false, false, -1
		}
		woken, stop := r.wait(ctx, wait, allowWake)
		if stop {
			return nil
		}
		if woken {
			// A wake means new events: read them straight after the position
			// this runner knows. A stale position (another replica advanced
			// it, or a reset moved it) is caught when the batch is acquired.
			// Only timed polls read the checkpoint first, so that a reset is
			// noticed even when no event arrives.
			rechecks, check = 0, false
			r.wokenAt = time.Now()
		} else if rechecks < 0 {
			r.wokenAt = time.Time{}
		}
	}
}

// runner holds one Run call's loop state; it is owned by Run's goroutine.
type runner struct {
	s     *Subscriber
	wake  <-chan struct{}
	timer *time.Timer
	// prefix, when positive, limits the next batch to the events before a
	// failing one so that they commit without it.
	prefix int
	// known is the checkpoint as this runner last saw or committed it, the
	// position the next batch reads after; -1 when it must be read again.
	known int64
	// drain is the context handlers run on (see drainContext).
	drain context.Context
	// fatal is the misconfiguration that ends Run (outcomeFatal).
	fatal error
	// wokenAt is when the wake signal being followed up arrived, for the
	// wake latency metric; zero when the cycle was not started by a wake.
	wokenAt time.Time
	// stopped is the last callHandler's answer from handle: the shutdown
	// grace period cut the handler short.
	stopped bool
	// pending is a first attempt that failed in the middle of a batch: once
	// the events before it have committed, the event goes straight to
	// failure handling instead of being attempted again without backoff.
	pending *pendingFailure
	// isolateUntil, when past the checkpoint, is the last position of a
	// batch whose commit failed through one of its events: up to it the
	// events run one per transaction, so that the failing one is found,
	// the ones before it commit, and it takes the failure path alone.
	isolateUntil int64
	// oneByOneThrough, when positive, is the last position of a batch the
	// BatchHandler failed: events up to it go one at a time (handleBatch).
	oneByOneThrough int64
	// attemptN is the count of the attempt the batch in flight makes at
	// its first event (countAttempt); clearOnCommit is set when that is a
	// retry, whose record the batch's commit removes. wrote is the last
	// attempt record this runner wrote.
	attemptN int
	// ownedAt is the checkpoint this runner's last batch committed, while
	// nothing else happened since (-1 otherwise): a batch from there skips
	// the committed attempt record (see countAttempt). clean marks a batch
	// in flight that continues no earlier attempt.
	ownedAt       int64
	clean         bool
	clearOnCommit bool
	wrote         AttemptRecord
	// holder names this runner in the attempt records it writes.
	holder string
	// countChecked: the name's partition count was read (readCheckpoint);
	// set from the start for a partition's runner, whose Run checked it.
	countChecked bool
	// queues is what the runner knows of the subscriber's queues
	// (WithOrderedParking).
	queues queueView
	// deferBackoff, set by a Group, makes failed return outcomeBackoff
	// instead of sleeping through a retry backoff, so that no worker
	// waits; retry is then the attempt due, which the next cycle makes.
	deferBackoff bool
	retry        *dueRetry
}

// dueRetry is the next attempt at a failing event, the one after start,
// due at at (see runner.deferBackoff).
type dueRetry struct {
	start int64
	ev    domain.EventEnvelope[any]
	first trace.SpanContext
	at    time.Time
}

// newRunner returns the runner of one Run of s (or of one partition of
// it), with its timer stopped and a holder name of its own.
func newRunner(s *Subscriber, wake <-chan struct{}, drain context.Context) *runner {
	r := &runner{s: s, wake: wake, timer: time.NewTimer(time.Hour), known: -1, ownedAt: -1, drain: drain, holder: newHolder(), queues: queueView{at: -1}}
	r.timer.Stop()
	return r
}

// newHolder names a runner in the attempt records it claims (see
// AttemptCounter): random, so that no other runner, in this process or
// another, or after a restart, has the same.
func newHolder() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

type pendingFailure struct {
	eventID  string
	position int64
	err      error
}

// wait blocks for d, until a wake signal (when allowed) or until ctx is
// cancelled. A closed wake channel is logged once and dropped: the
// subscriber then polls.
func (r *runner) wait(ctx context.Context, d time.Duration, allowWake bool) (woken, stop bool) {
	r.timer.Reset(d)
	defer r.timer.Stop()
	for {
		var wake <-chan struct{}
		if allowWake {
			wake = r.wake
		}
		select {
		case <-ctx.Done():
			return false, true
		case <-r.timer.C:
			return false, false
		case _, ok := <-wake:
			if !ok {
				r.s.logger.Warn("subscriber: wake signal channel closed; falling back to polling", "subscriber", r.s.name, "poll_interval", r.s.pollInterval)
				r.wake = nil
				continue
			}
			return true, false
		}
	}
}

// cycle runs one batch: read the events past the checkpoint and acquire
// the checkpoint (acquire: one acquirer call), run the handler for each
// event and commit (runBatch).
//
// The events are read after the position this runner last committed or
// saw, and the acquired position is then checked against it (doc.go states
// the model; acquirer says how the stores are reached).
//
// Once a batch is acquired it runs on a context that ignores ctx's
// cancellation, so that shutdown drains it instead of abandoning it.
func (r *runner) cycle(ctx context.Context, check bool) outcome {
	if p := r.retry; p != nil {
		// A deferred backoff is over (or was cut short by a reset or a
		// resume): the attempt acquires the checkpoint again and finds it
		// moved if it was reset.
		r.retry = nil
		r.queues.at = -1
		out, done, n, err := r.attempt(ctx, p.start, p.ev, p.first)
		if done {
			return out
		}
		return r.retrying(ctx, p.start, p.ev, n, err, p.first)
	}
	b, out, ok := r.acquire(ctx, check)
	if !ok {
		r.queues.at = -1
		return out
	}
	out = r.runBatch(ctx, b)
	if out != outcomeMore {
		r.queues.at = -1 // a wait follows: see queueView
	}
	return out
}

// cycleBatch is what acquire hands runBatch: the batch holding the
// checkpoint at start and the events after it, limit at most.
type cycleBatch struct {
	batch  Batch
	events []domain.EventEnvelope[any]
	start  int64
	limit  int
	// delivery is the nature of every event of the batch (sameDelivery).
	delivery Delivery
}

// acquire reads the checkpoint when check says so (or this runner does not
// know it), then reads the events after it and acquires the checkpoint,
// and counts the attempt the batch makes at its first event
// (countAttempt). ok is false when the cycle ends there with out: nothing
// past the checkpoint, another replica holds it, it moved, a failure was
// logged, or the first event's failure is pending (takePending), which
// goes straight to failure handling.
func (r *runner) acquire(ctx context.Context, check bool) (b cycleBatch, out outcome, ok bool) {
	s := r.s
	if check || r.known < 0 {
		position, err := r.readCheckpoint(ctx)
		if err != nil {
			return b, r.transient(ctx, "reading the checkpoint failed", err), false
		}
		r.known = position
	}
	limit, prefixCycle := r.nextLimit()
	start := r.known

	// On a wake (or while catching up) the position is known and work is
	// expected: the acquirer may then take its faster path (see acquirer).
	batch, events, err := s.acquirer.acquireAfter(ctx, s.name, start, limit, !check)
	var readErr *feedReadError
	switch {
	case errors.Is(err, errCheckpointHeld):
		if !prefixCycle {
			r.pending = nil // as takePending would: the holder handles the event
		}
		// r.known stays: the next lock returns the real position, and a
		// batch that finds it moved reads again from there (below), which
		// costs less than a read of the checkpoint before every attempt
		// at a partition another replica holds.
		return b, outcomeSkipped, false
	case errors.As(err, &readErr):
		return b, r.transient(ctx, "reading the feed failed", readErr.err), false
	case err != nil:
		s.logger.Error("subscriber: acquiring the checkpoint failed; will retry", "subscriber", s.name, "error", err)
		s.tel.fail("", nil, 0, err)
		return b, outcomeFailed, false
	case len(events) == 0:
		if batch != nil {
			r.rollback(batch)
		}
		return b, outcomeIdle, false
	}
	if batch != nil && batch.Position() == RetiredCheckpoint {
		// A Repartition retired this layout: nothing past its position is
		// this runner's to handle.
		r.rollback(batch)
		r.fatal = s.retiredError(ctx, s.name)
		return b, outcomeFatal, false
	}
	if p := r.takePending(events[0], prefixCycle); p != nil {
		if batch != nil {
			r.rollback(batch)
		}
		r.known = -1
		return b, r.failed(ctx, start, events[0], 1, p.err, trace.SpanContext{}), false
	}
	if batch == nil {
		r.known = -1
		return b, outcomeSkipped, false // another replica holds the checkpoint
	}
	if batch.Position() != start {
		// Another replica advanced the checkpoint, or it was reset: read
		// again from where it really is.
		r.rollback(batch)
		r.known = batch.Position()
		return b, outcomeMore, false
	}
	// Every call of the batch has one Delivery: it ends where the nature
	// changes, and the rest comes in the next batch at once.
	delivery, same := sameDelivery(batch, events)
	if len(same) < len(events) {
		events, limit = same, len(same)
	}
	if out, ok := r.countAttempt(context.WithoutCancel(ctx), batch, start, events); !ok {
		return b, out, false
	}
	return cycleBatch{batch: batch, events: events, start: start, limit: limit, delivery: delivery}, 0, true
}

// readCheckpoint reads the subscriber's checkpoint; the first read of a
// Run also reads the name's partition count (in the same statement where
// the store allows) and refuses a name that was run partitioned
// (ErrPartitionsChanged, which transient makes fatal): running from its
// stale plain checkpoint would handle events twice. A checkpoint a
// Repartition retired is refused the same way, at any read.
func (r *runner) readCheckpoint(ctx context.Context) (int64, error) {
	s := r.s
	var position int64
	if r.countChecked {
		var err error
		if position, err = s.checkpoints.Position(ctx, s.name); err != nil {
			return 0, err
		}
	} else {
		positions, err := s.checkpointPositions(ctx, []string{s.name})
		if err != nil {
			return 0, err
		}
		r.countChecked, position = true, positions[0]
	}
	if position == RetiredCheckpoint { // see acquire
		return 0, s.retiredError(ctx, s.name)
	}
	return position, nil
}

// runBatch runs the handlers of b's events (through the BatchHandler
// first, when there is one: handleBatch) and commits the batch; a handler's
// failure ends it in handlerFailed. It ends b.batch.
func (r *runner) runBatch(ctx context.Context, b cycleBatch) outcome {
	s := r.s
	batch, events := b.batch, b.events
	finished := false
	defer func() {
		// Only reached unfinished when a handler panics: release the
		// checkpoint and let the panic propagate.
		if !finished {
			_ = batch.Rollback()
		}
	}()
	s.tel.batchStarted()
	tctx, span := s.tel.startBatch(r.drain, events, 0, trace.SpanContext{})
	var batchErr error
	defer func() { span.end(tctx, batchErr) }()
	hctx := withDelivery(batch.HandlerContext(tctx), b.delivery)
	wokenAt := r.wokenAt
	r.wokenAt = time.Time{}
	if q := s.queues; q != nil {
		if err := r.queues.lookUp(hctx, q, b.start); err != nil {
			finished, batchErr = true, err
			return r.queueFailed(batch, events[0], "looking up the parked aggregates failed", err)
		}
	}
	perEvent, out, done, berr := r.handleBatch(hctx, batch, events)
	if done {
		finished = true
		batchErr = berr
		return out
	}
	for i, ev := range perEvent {
		if i > 0 {
			wokenAt = time.Time{}
		}
		if held, err := r.hold(hctx, ev); err != nil {
			finished, batchErr = true, err
			return r.queueFailed(batch, ev, "holding the event behind its aggregate's parked event failed", err)
		} else if held {
			continue
		}
		if err := handlerResult(hctx, batch, span.handle(hctx, r.callHandler, ev, 1, wokenAt)); err != nil {
			finished, batchErr = true, err
			return r.handlerFailed(ctx, tctx, span, b, i, ev, err)
		}
		r.handled(ev)
	}
	finished = true
	if r.graceExpired() {
		r.rollback(batch)
		return outcomeStopped
	}
	last := events[len(events)-1].Position
	if err := r.commit(context.WithoutCancel(ctx), hctx, batch, b.start, last); err != nil {
		batchErr = err
		return r.commitFailed(ctx, tctx, span, b.start, events, err)
	}
	s.tel.committed(last)
	held := len(r.queues.held)
	s.tel.count(tctx, OutcomeHandled, len(events)-held)
	s.tel.count(tctx, OutcomeHeld, held)
	r.known = last
	if s.queues != nil {
		r.queues.at = last
	}
	if len(events) == b.limit {
		return outcomeMore
	}
	return outcomeIdle
}

// handlerFailed ends the batch b whose handler failed (err) at ev, the
// i-th event the handlers ran; span is the batch's, tctx its context.
// Apart from a shutdown or a reset, which discard the batch, the events
// before ev commit without it (a prefix batch, or one transaction per
// event when the failure may be an earlier handler's), and ev as the first
// of a batch takes the failure path (failed).
func (r *runner) handlerFailed(ctx, tctx context.Context, span *batchSpan, b cycleBatch, i int, ev domain.EventEnvelope[any], err error) outcome {
	s := r.s
	batch := b.batch
	stopped := r.stopped
	if stopped || resetAborted(batch) {
		r.rollback(batch)
	}
	if stopped {
		return outcomeStopped
	}
	if resetAborted(batch) {
		r.known = -1
		s.logger.Info("subscriber: checkpoint was reset during the batch; batch discarded", "subscriber", s.name, "error", err)
		return outcomeMore
	}
	if i > 0 && s.failedEarlier(err) {
		// The transaction had failed before this handler ran: an earlier
		// handler may have swallowed its failed statement. Run the events
		// one per transaction to find the culprit.
		s.logger.Warn("subscriber: the batch transaction had failed before this event's handler; running its events one per transaction to find the failing one",
			append(s.eventAttrs(ev), "from", b.events[0].Position, "error", err)...)
		r.rollback(batch)
		r.isolateUntil = ev.Position
		return outcomeMore
	}
	if i > 0 {
		// Commit the events before the failing one in a batch of their
		// own, right away; the failing event comes first in the next, and
		// the prefix batch records the failure (countAttempt). Until then
		// a marker tells the replicas that take over.
		r.recordFailure(ctx, batch, b.start, ev, 0, err)
		r.prefix = i
		r.pending = &pendingFailure{eventID: ev.ID, position: ev.Position, err: err}
		return outcomeMore
	}
	n := r.attemptN
	if !r.wrote.single(ev.Position) {
		n = 1 // the first attempt, in a batch of several events
	}
	r.recordFailure(ctx, batch, b.start, ev, n, err)
	r.known = -1
	// The batch is over: end its span and duration before the retry
	// schedule (backoff sleeps, retry batches of their own).
	span.end(tctx, err)
	return r.failed(ctx, b.start, ev, n, err, span.spanContext())
}

// nextLimit is the next batch's size: the events before a failing one
// (prefix), one while a failed commit's batch is isolated, else the batch
// size. prefixCycle reports the first.
func (r *runner) nextLimit() (limit int, prefixCycle bool) {
	limit, prefixCycle = r.s.batchSize, r.prefix > 0
	if prefixCycle {
		limit, r.prefix = r.prefix, 0
	}
	if r.isolateUntil > r.known {
		limit = 1
	} else {
		r.isolateUntil = 0
	}
	return limit, prefixCycle
}

// commitFailed handles the failed commit (err) of a batch whose handlers
// all succeeded for events, the batch after start; span is the batch's.
func (r *runner) commitFailed(ctx, tctx context.Context, span *batchSpan, start int64, events []domain.EventEnvelope[any], err error) outcome {
	s := r.s
	last := events[len(events)-1].Position
	r.known = -1
	switch {
	case errors.Is(err, ErrCheckpointMoved):
		s.logger.Info("subscriber: checkpoint was reset during the batch; batch discarded", "subscriber", s.name, "error", err)
		return outcomeMore
	case !s.eventCaused(err):
		s.logger.Error("subscriber: committing the batch failed; will retry", "subscriber", s.name, "position", last, "error", err)
		s.tel.fail("", nil, 0, err)
		return outcomeFailed
	case len(events) > 1:
		// One of the events made the commit fail: find it by running
		// the batch again one event per transaction.
		s.logger.Warn("subscriber: committing the batch failed; running its events one per transaction to find the failing one",
			"subscriber", s.name, "from", events[0].Position, "to", last, "error", err)
		r.isolateUntil = last
		return outcomeMore
	}
	// The batch is over: end its span and duration before the retry
	// schedule (backoff sleeps, retry batches of their own).
	span.end(tctx, err)
	n := r.attemptN
	if !r.wrote.single(events[0].Position) {
		n = 1
	}
	r.recordFailure(ctx, nil, start, events[0], n, err)
	return r.failed(ctx, start, events[0], n, err, span.spanContext())
}

// takePending clears r.pending, except on the prefix cycle that commits
// the events before it, and returns it when first is its event: the event
// then goes straight to failure handling.
func (r *runner) takePending(first domain.EventEnvelope[any], prefixCycle bool) *pendingFailure {
	p := r.pending
	if p == nil || prefixCycle {
		return nil
	}
	r.pending = nil
	if first.ID != p.eventID || first.Position != p.position {
		return nil
	}
	return p
}

// commit ends a batch whose handlers succeeded for the events in
// (start, last]: it removes their parking lot entries, so that a parked
// entry does not outlive its event's successful handling (see
// deliveredClearer), and commits the checkpoint at last. A lot that joins
// the batch's transaction (hctx) removes them in it, and a failure there
// is a commit failure. A lot that cannot (one in memory, or one on another
// database than the checkpoint store) removes them only after the commit
// succeeded, so that a failed commit never drops the entry of an event it did not handle; a removal failing then is
// logged, and the entry stays until a later delivery or replay removes it
// (see doc.go). batch is ended either way.
func (r *runner) commit(bctx, hctx context.Context, batch Batch, start, last int64) error {
	err := r.commitBatch(bctx, hctx, batch, start, last)
	if err == nil && r.clean {
		r.ownedAt = last
	} else {
		r.ownedAt = -1
	}
	r.clean = false
	return err
}

// commitBatch is commit without the ownedAt bookkeeping.
func (r *runner) commitBatch(bctx, hctx context.Context, batch Batch, start, last int64) error {
	if r.clearOnCommit {
		r.clearOnCommit = false
		if err := r.s.attempts.ClearAttempt(hctx, batch, r.s.name); err != nil {
			r.rollback(batch)
			return staged(stageLibrary, err)
		}
	}
	c := r.s.clearer
	if c == nil {
		return batch.Commit(bctx, last)
	}
	if !c.ClearsInBatch(hctx) {
		if err := batch.Commit(bctx, last); err != nil {
			return err
		}
		if err := r.clearDelivered(bctx, c, start, last); err != nil {
			r.s.logger.Error("subscriber: removing the parked entries of delivered events failed; they stay listed", "subscriber", r.s.name, "from", start+1, "to", last, "error", err)
		}
		return nil
	}
	if err := r.clearDelivered(hctx, c, start, last); err != nil {
		r.rollback(batch)
		return staged(stageLibrary, err)
	}
	return batch.Commit(bctx, last)
}

// transient logs a failure outside a batch, unless it is only the
// cancellation of ctx.
func (r *runner) transient(ctx context.Context, what string, err error) outcome {
	if ctx.Err() != nil {
		return outcomeStopped
	}
	if errors.Is(err, domain.ErrGlobalOrderingNotSupported) || errors.Is(err, ErrPartitionsChanged) {
		r.fatal = err
		return outcomeFatal
	}
	r.s.logger.Error("subscriber: "+what+"; will retry", "subscriber", r.s.name, "error", err)
	r.s.tel.fail("", nil, 0, err)
	r.known = -1
	return outcomeFailed
}

func (r *runner) rollback(batch Batch) {
	if err := batch.Rollback(); err != nil {
		r.s.logger.Warn("subscriber: rolling back the batch failed", "subscriber", r.s.name, "error", err)
	}
}

// failed handles an event whose attempt n failed (its handler, or the
// commit of its transaction), as the first event of a batch, so that
// nothing else is lost by abandoning it. The caller has recorded the
// failure (recordFailure) for whichever replica or restart makes the next
// attempt.
//
// Without a parking lot the event halts the checkpoint and is retried after
// each poll interval. With one, it is retried with backoff, each retry in
// a short transaction of its own (no transaction or row lock is held while
// waiting), and parked once 1 + WithMaxRetries attempts, counted across
// replicas and restarts, have failed. first is the span of the failed
// batch, which the retry batches' spans link to.
func (r *runner) failed(ctx context.Context, start int64, ev domain.EventEnvelope[any], n int, err error, first trace.SpanContext) outcome {
	s := r.s
	if s.parking == nil {
		s.logger.Error("subscriber: processing the event failed; it will be retried after the poll interval",
			append(s.eventAttrs(ev), "attempt", n, "error", err)...)
		// Counted before Status shows attempt n: a reader of both never
		// sees the attempt without its count.
		s.tel.count(ctx, OutcomeFailed, 1)
		s.tel.fail(StateHalted, &ev, n, err)
		return outcomeFailed
	}
	attempts := s.retry.attempts()
	if n >= attempts {
		// WithMaxRetries(0), or the last attempt ran in an ordinary batch
		// (another replica's retries came first): park it.
		return r.park(ctx, start, ev, n, err, first)
	}
	return r.retrying(ctx, start, ev, n, err, first)
}

// retrying is failed's retry schedule from the failed attempt n (err):
// it waits the backoff and makes the next attempt until one is done. A
// runner with deferBackoff returns outcomeBackoff instead of waiting,
// with the attempt due in r.retry.
func (r *runner) retrying(ctx context.Context, start int64, ev domain.EventEnvelope[any], n int, err error, first trace.SpanContext) outcome {
	s := r.s
	attempts := s.retry.attempts()
	for {
		s.logger.Warn("subscriber: processing the event failed; retrying", append(s.eventAttrs(ev), "attempt", n, "of", attempts, "error", err)...)
		s.tel.count(ctx, OutcomeRetried, 1) // before Status shows attempt n, as in failed
		s.tel.fail(StateRetrying, &ev, n, err)
		if r.deferBackoff {
			r.retry = &dueRetry{start: start, ev: ev, first: first, at: time.Now().Add(s.retry.backoff(n))}
			return outcomeBackoff
		}
		if !ctxsleep.Sleep(ctx, s.retry.backoff(n)) {
			return outcomeStopped
		}
		out, done, an, aerr := r.attempt(ctx, start, ev, first)
		if done {
			return out
		}
		n, err = an, aerr
	}
}

// acquireAt acquires the checkpoint for one more attempt at the event
// after start. ok is false when the caller is to return out: the
// acquisition failed, another replica holds the checkpoint, or the
// checkpoint is no longer at start (another replica handled the event, or
// it was reset).
func (r *runner) acquireAt(bctx context.Context, start int64, ev domain.EventEnvelope[any]) (batch Batch, out outcome, ok bool) {
	s := r.s
	batch, acquired, err := s.checkpoints.Acquire(bctx, s.name)
	switch {
	case err != nil:
		s.logger.Error("subscriber: acquiring the checkpoint for a retry failed", append(s.eventAttrs(ev), "error", err)...)
		s.tel.fail("", &ev, 0, err)
		return nil, outcomeFailed, false
	case !acquired:
		return nil, outcomeSkipped, false // another replica took over
	case batch.Position() != start:
		// Another replica handled the event, or the checkpoint was reset.
		r.rollback(batch)
		return nil, outcomeMore, false
	}
	return batch, 0, true
}

// attempt runs the next attempt at ev in a transaction of its own and
// commits it; countAttempt numbers it (n), or parks the event when its
// attempts are used up. done is false when the attempt failed and more
// attempts remain; err is then the failure. The last attempt brackets the
// handler with a savepoint, so that when the handler fails the event is
// parked and the checkpoint advanced in the same transaction; when the
// commit fails, the event is parked in a transaction of its own (see
// park).
func (r *runner) attempt(ctx context.Context, start int64, ev domain.EventEnvelope[any], first trace.SpanContext) (out outcome, done bool, n int, err error) {
	s := r.s
	bctx := context.WithoutCancel(ctx)
	batch, out, ok := r.acquireAt(bctx, start, ev)
	if !ok {
		return out, true, 0, nil
	}
	r.queues.held = r.queues.held[:0] // the event alone, handled
	if out, ok := r.countAttempt(bctx, batch, start, []domain.EventEnvelope[any]{ev}); !ok {
		return out, true, 0, nil
	}
	n = r.attemptN
	final := n >= s.retry.attempts()
	finished := false
	defer func() {
		if !finished { // a handler panic
			_ = batch.Rollback()
		}
	}()
	tctx, span := s.tel.startBatch(r.drain, []domain.EventEnvelope[any]{ev}, n, first)
	var batchErr error
	defer func() { span.end(tctx, batchErr) }()
	if final {
		if err := batch.Savepoint(bctx, attemptSavepoint); err != nil {
			finished, batchErr = true, err
			return r.abandon(batch, ev, "subscriber: savepoint failed", err), true, n, nil
		}
	}
	delivery, _ := marksOf(batch).at(ev.Position)
	hctx := withDelivery(batch.HandlerContext(tctx), delivery)
	herr := handlerResult(hctx, batch, span.handle(hctx, r.callHandler, ev, n, time.Time{}))
	batchErr = herr
	finished = true
	if r.stopped {
		r.rollback(batch)
		return outcomeStopped, true, n, nil
	}
	if herr != nil && resetAborted(batch) {
		r.rollback(batch)
		return outcomeMore, true, n, nil // the reset moved the checkpoint
	}
	if herr == nil {
		if r.graceExpired() {
			r.rollback(batch)
			return outcomeStopped, true, n, nil
		}
		cerr := r.commit(bctx, hctx, batch, start, ev.Position)
		batchErr = cerr
		switch {
		case cerr == nil:
			s.logger.Info("subscriber: event succeeded on retry", append(s.eventAttrs(ev), "attempt", n)...)
			s.tel.committed(ev.Position)
			s.tel.count(tctx, OutcomeHandled, 1)
			return outcomeMore, true, n, nil
		case errors.Is(cerr, ErrCheckpointMoved):
			return outcomeMore, true, n, nil
		case !s.eventCaused(cerr):
			s.logger.Error("subscriber: committing a retried event failed; will retry", append(s.eventAttrs(ev), "error", cerr)...)
			s.tel.fail("", &ev, 0, cerr)
			return outcomeFailed, true, n, nil
		case final:
			span.end(tctx, cerr) // its transaction is over; the parking has a batch of its own
			r.recordFailure(ctx, nil, start, ev, n, cerr)
			return r.park(ctx, start, ev, n, cerr, first), true, n, nil
		}
		r.recordFailure(ctx, nil, start, ev, n, cerr)
		return outcomeFailed, false, n, cerr
	}
	if !final {
		r.recordFailure(ctx, batch, start, ev, n, herr)
		return outcomeFailed, false, n, herr
	}
	if errors.Is(herr, ErrBatchTxEnded) {
		// No savepoint to go back to: the transaction is gone. Park in a
		// transaction of its own, as after a failed commit.
		r.rollback(batch)
		span.end(tctx, herr)
		r.recordFailure(ctx, nil, start, ev, n, herr)
		return r.park(ctx, start, ev, n, herr, first), true, n, nil
	}
	if err := batch.RollbackToSavepoint(bctx, attemptSavepoint); err != nil {
		batchErr = err
		return r.abandon(batch, ev, "subscriber: discarding a failed attempt's writes failed", err), true, n, nil
	}
	out, batchErr = r.parkIn(tctx, bctx, batch, ev, n, herr)
	return out, true, n, nil
}

// park parks ev, whose attempts all failed with cause as the last
// failure, in a transaction of its own (the handler is not run again).
func (r *runner) park(ctx context.Context, start int64, ev domain.EventEnvelope[any], attempts int, cause error, first trace.SpanContext) outcome {
	bctx := context.WithoutCancel(ctx)
	batch, out, ok := r.acquireAt(bctx, start, ev)
	if !ok {
		return out
	}
	tctx, span := r.s.tel.startBatch(r.drain, []domain.EventEnvelope[any]{ev}, attempts, first)
	out, err := r.parkIn(tctx, bctx, batch, ev, attempts, cause)
	span.end(tctx, err)
	return out
}

// parkIn records ev in the parking lot through batch and commits the
// checkpoint past it, in one transaction where the lot allows (see
// ParkingLot.Park). It ends batch, and returns the error that failed it.
func (r *runner) parkIn(tctx, bctx context.Context, batch Batch, ev domain.EventEnvelope[any], attempts int, cause error) (outcome, error) {
	s := r.s
	finished := false
	defer func() {
		if !finished {
			_ = batch.Rollback()
		}
	}()
	parked := ParkedEvent{
		Subscriber:  s.name,
		EventID:     ev.ID,
		EventType:   ev.EventType,
		Position:    ev.Position,
		Error:       cause.Error(),
		Attempts:    attempts,
		ParkedAt:    time.Now().UTC(),
		AggregateID: ev.AggregateID,
	}
	hctx := batch.HandlerContext(tctx)
	if err := s.attempts.ClearAttempt(hctx, batch, s.name); err != nil {
		finished = true
		return r.abandon(batch, ev, "subscriber: clearing the attempt count of a parked event failed; it will be retried", err), err
	}
	if err := s.parking.Park(hctx, parked); err != nil {
		finished = true
		if r.graceExpired() {
			r.rollback(batch)
			return outcomeStopped, err
		}
		return r.abandon(batch, ev, "subscriber: parking the event failed; it will be retried", err), err
	}
	finished = true
	if r.graceExpired() {
		r.rollback(batch)
		return outcomeStopped, nil
	}
	s.tel.fail("", &ev, 0, cause)
	if err := batch.Commit(bctx, ev.Position); err != nil {
		s.logger.Error("subscriber: committing a parked event failed; it will be retried", append(s.eventAttrs(ev), "error", err)...)
		s.tel.fail("", &ev, 0, err)
		return outcomeFailed, err
	}
	s.logger.Error("subscriber: event parked after exhausting its retries",
		append(s.eventAttrs(ev), "attempts", attempts, "error", cause)...)
	s.tel.committed(ev.Position)
	s.tel.count(tctx, OutcomeParked, 1)
	return outcomeMore, cause
}

// abandon rolls back batch and logs why.
func (r *runner) abandon(batch Batch, ev domain.EventEnvelope[any], msg string, err error) outcome {
	r.rollback(batch)
	r.s.logger.Error(msg, append(r.s.eventAttrs(ev), "error", err)...)
	r.s.tel.fail("", &ev, 0, err)
	return outcomeFailed
}

// attemptSavepoint brackets the last attempt at a failing event.
const attemptSavepoint = "subscriber_attempt"
