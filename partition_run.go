package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// partitionProbeLimit bounds the coordinator's read of new events: past it,
// every partition is simply marked as having work.
const partitionProbeLimit = 1000

// partitionState is one partition's scheduling state; guarded by
// partitionSet.mu, except r, which belongs to the worker holding the
// partition (claimed).
type partitionState struct {
	r *runner
	// dirty: the partition may have work (new events seen by the probe, a
	// moved checkpoint, a retry that is due).
	dirty, claimed, queued bool
	// recheck: read the checkpoint before the next batch (it moved).
	recheck bool
	// seen is the checkpoint as this process last knew it, -1 unknown.
	seen int64
	// retryAt: not before this time (a transient failure: a poll interval
	// later; another replica held the checkpoint: after skipDelay).
	retryAt time.Time
	// skipDelay doubles, from partitionSkipRetry up to the poll interval,
	// while other replicas keep holding the partition, so that idle
	// workers here pick up a partition another replica released between
	// its batches (spreading the partitions) without polling it hard. It
	// is 0 after any other outcome.
	skipDelay time.Duration
	// streak counts the batches in a row this process ran on the
	// partition (partitionStreak).
	streak int
}

// partitionStreak is how many batches in a row a partition with more work
// goes to the front of the queue: a worker keeps its partition for that
// long (no lock handed to another replica between batches, no skipped
// attempts at partitions held elsewhere), then lets the others have a turn.
const partitionStreak = 8

// partitionSkipRetry is the first delay before a partition held by another
// replica is tried again.
const partitionSkipRetry = 5 * time.Millisecond

// partitionSet is the state shared by a partitioned Run's coordinator and
// workers. Work is a FIFO of dirty, unclaimed partitions; kick wakes idle
// workers (buffered to the worker count, so a signal is never lost).
type partitionSet struct {
	mu    sync.Mutex
	parts []*partitionState
	queue []int
	kick  chan struct{}
	// index is the workers' feed index (Postgres; nil elsewhere), which
	// the sweep rewinds after a reset.
	index *partitionIndex
	// failure: a worker's fatal error or handler panic, ending Run.
	fatal    error
	panicked any
	abort    context.CancelFunc
}

// mark records that partition p may have work and queues it unless a
// worker holds it (the worker re-queues it on release).
func (ps *partitionSet) mark(p int, recheck bool) {
	st := ps.parts[p]
	st.dirty = true
	st.recheck = st.recheck || recheck
	if st.claimed || st.queued {
		return
	}
	st.queued = true
	ps.queue = append(ps.queue, p)
	select {
	case ps.kick <- struct{}{}:
	default:
	}
}

// take blocks until a partition is queued, claims it and clears its dirty
// flag before the worker reads anything: an event the probe sees later
// marks it again. ok is false once ctx is done.
func (ps *partitionSet) take(ctx context.Context) (p int, check bool, ok bool) {
	for {
		ps.mu.Lock()
		if len(ps.queue) > 0 {
			p = ps.queue[0]
			ps.queue = ps.queue[1:]
			st := ps.parts[p]
			st.queued, st.claimed, st.dirty = false, true, false
			check, st.recheck = st.recheck, false
			ps.mu.Unlock()
			return p, check, true
		}
		ps.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, false, false
		case <-ps.kick:
		}
	}
}

// release hands the partition back after one cycle.
func (ps *partitionSet) release(p int, out outcome, pollInterval time.Duration) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	st := ps.parts[p]
	st.claimed = false
	st.seen = st.r.known
	if out != outcomeSkipped {
		st.skipDelay = 0
	}
	switch out {
	case outcomeMore:
		st.dirty = true
	case outcomeSkipped:
		st.skipDelay = min(max(2*st.skipDelay, partitionSkipRetry), pollInterval)
		st.retryAt, st.dirty = time.Now().Add(st.skipDelay), false
	case outcomeFailed:
		st.retryAt, st.dirty = time.Now().Add(pollInterval), false
	}
	if out == outcomeMore && st.streak < partitionStreak {
		st.streak++
		st.dirty, st.queued = true, true
		ps.queue = append([]int{p}, ps.queue...)
		select {
		case ps.kick <- struct{}{}:
		default:
		}
		return
	}
	st.streak = 0
	if st.dirty {
		st.dirty = false
		ps.mark(p, false)
	}
}

// runPartitioned is Run for a subscriber with WithPartitions: the
// coordinator (this goroutine) finds the partitions with work, and
// s.concurrency workers run the ordinary per-name cycle on them.
//
// Idle cost does not grow with the number of partitions: per poll interval
// the coordinator reads the feed past the last position it saw (one
// statement; it names the partitions that got events) and every partition's
// checkpoint (one statement; a moved one, after a reset or another
// replica's batch, is looked at again). Only partitions with work then cost
// statements. A wake signal triggers the feed read at once.
func (s *Subscriber) runPartitioned(ctx context.Context) error {
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		if errors.Is(err, domain.ErrGlobalOrderingNotSupported) {
			return fmt.Errorf("subscriptions: subscriber %q cannot run: %w", s.name, err)
		}
		if ctx.Err() != nil {
			return nil
		}
		s.logger.Warn("subscriber: reading the feed head failed; will retry", "subscriber", s.name, "error", err)
	}
	if s.startCatchUp(ctx) {
		return nil
	}
	// Checking the partition count is the one failure that ends Run before
	// it starts; database errors are retried like any other.
	for {
		err := s.initPartitions(ctx)
		if err == nil {
			break
		}
		if errors.Is(err, ErrPartitionsChanged) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		s.logger.Error("subscriber: initialising the partitions failed; will retry", "subscriber", s.name, "error", err)
		t := time.NewTimer(s.pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
	k := max(s.concurrency, 1)
	s.logger.Info("subscriber started", "subscriber", s.name, "batch_size", s.batchSize, "poll_interval", s.pollInterval,
		"partitions", s.partitions, "concurrency", k)
	defer s.logger.Info("subscriber stopped", "subscriber", s.name)
	defer s.tel.observe(s)()

	wctx, abort := context.WithCancel(ctx)
	defer abort()
	// One drain context for every worker: batches in flight when ctx is
	// cancelled drain (or get the shutdown grace), as in Run.
	drain, stopDrain := s.drainContext(ctx)
	defer stopDrain()
	names := s.partitionNames()
	// Every checkpoint in one read: it starts the feed index and each
	// partition's first batch, instead of a read per partition.
	positions, err := s.storePositions(ctx, names)
	if err != nil {
		positions = nil
		if ctx.Err() == nil {
			s.logger.Warn("subscriber: reading the partition checkpoints failed; each partition reads its own instead", "subscriber", s.name, "error", err)
		}
	}
	index := s.newPartitionIndex(positions)
	ps := &partitionSet{parts: make([]*partitionState, s.partitions), kick: make(chan struct{}, k), abort: abort, index: index}
	tels := s.tel.partitions(s.partitions)
	for p := range ps.parts {
		child := s.partitionChild(names[p], p, index, tels[p])
		r := newRunner(child, nil, drain)
		r.countChecked = true // initPartitions did
		defer r.timer.Stop()
		ps.parts[p] = &partitionState{r: r, seen: -1}
		if positions != nil {
			r.known, ps.parts[p].seen = positions[p], positions[p]
		}
	}
	// Every partition is looked at once; the probe then starts at the head
	// read before that, so nothing committed since is missed. Replicas
	// start at different partitions, so that they seldom collide. A
	// position read above may be stale by the first batch (another
	// replica's batch, a reset): the batch's lock returns the checkpoint's
	// real position, and a batch that finds it moved reads again from
	// there (runner.cycle), as after any stale position.
	ps.mu.Lock()
	offset := rand.IntN(s.partitions)
	for i := range ps.parts {
		ps.mark((offset+i)%s.partitions, positions == nil)
	}
	ps.mu.Unlock()

	var wg sync.WaitGroup
	for i := 0; i < k; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.partitionWorker(wctx, ps)
		}()
	}
	s.coordinate(wctx, ps, head)
	abort()
	wg.Wait()
	if ps.panicked != nil {
		panic(ps.panicked)
	}
	if ps.fatal != nil {
		return fmt.Errorf("subscriptions: subscriber %q cannot run: %w", s.name, ps.fatal)
	}
	return nil
}

// partitionChild is the subscriber that runs partition p: this one's
// configuration (shared, not copied) over the partition's view of the
// feed, its own checkpoint name, parking under this subscriber's name,
// and what NewSubscriber derives for a Subscriber made for the partition:
// its live state (tel), its acquirer and its clearer. A partition is
// unpartitioned (partitions and concurrency 0), and its runner is given no
// wake channel (the coordinator's).
func (s *Subscriber) partitionChild(name string, p int, index *partitionIndex, tel *telemetry) *Subscriber {
	feed := newPartitionFeed(s.events, p, s.partitions)
	feed.index = index
	c := &Subscriber{
		name:        name,
		events:      feed,
		checkpoints: s.checkpoints,
		config:      s.config,
		tel:         tel,
		// Each partition has a checkpoint row, and so a record, of its own.
		attempts:   s.attempts,
		classifier: s.classifier,
		parent:     s,
	}
	c.acquirer = readThenAcquire{events: c.events, checkpoints: c.checkpoints}
	// The indexed acquirer reads the events in the batch's transaction:
	// only when the checkpoint store's batches read this feed.
	if sharer, ok := s.checkpoints.(FeedSharer); ok && index != nil && sharer.SharesFeed(undecorated(s.events)) {
		c.acquirer = indexedAcquirer{feed: feed, checkpoints: c.checkpoints, fallback: c.acquirer}
	}
	if s.parking != nil {
		c.parking = partitionLot{ParkingLot: s.parking, name: s.name}
	}
	c.queues = s.queues // held under this subscriber's name too
	if lot, ok := s.clearer.(PartitionDeliveredClearer); ok {
		c.clearer = partitionClearer{lot: lot, name: s.name, partition: p, partitions: s.partitions}
	}
	return c
}

// newPartitionIndex returns the partitions' shared index of the feed when
// the event store is a FeedIndex (nil otherwise), its window started at
// the lowest partition checkpoint of positions (nil: unknown, the first
// batch starts it).
func (s *Subscriber) newPartitionIndex(positions []int64) *partitionIndex {
	feed, ok := undecorated(s.events).(FeedIndex)
	if !ok {
		return nil
	}
	index := newPartitionIndex(feed, s.partitions)
	if positions != nil {
		index.start(slices.Min(positions))
	}
	return index
}

// partitionWorker runs one cycle at a time on whichever partition is
// queued, so that k workers share n partitions fairly. A cycle in flight
// when ctx is cancelled is drained, as in Run. A handler panic is carried
// to Run's goroutine.
func (s *Subscriber) partitionWorker(ctx context.Context, ps *partitionSet) {
	for {
		p, check, ok := ps.take(ctx)
		if !ok {
			return
		}
		r := ps.parts[p].r
		out, stop := s.partitionCycle(ctx, ps, r, check)
		ps.release(p, out, s.pollInterval)
		if stop {
			return
		}
	}
}

func (s *Subscriber) partitionCycle(ctx context.Context, ps *partitionSet, r *runner, check bool) (out outcome, stop bool) {
	defer func() {
		if v := recover(); v != nil {
			ps.mu.Lock()
			if ps.panicked == nil {
				ps.panicked = v
			}
			ps.mu.Unlock()
			ps.abort()
			out, stop = outcomeStopped, true
		}
	}()
	out = r.cycle(ctx, check || r.known < 0)
	switch out {
	case outcomeIdle:
		r.s.tel.caughtUp() // as Run does for an unpartitioned subscriber
	case outcomeSkipped:
		r.s.tel.setState(StateIdle)
	case outcomeStopped:
		return out, true
	case outcomeFatal:
		ps.mu.Lock()
		if ps.fatal == nil {
			ps.fatal = r.fatal
		}
		ps.mu.Unlock()
		ps.abort()
		return out, true
	}
	return out, false
}

// coordinate finds work for the workers until ctx is done: on each poll
// interval and each wake signal it probes the feed past scanned; on poll
// intervals it also reads every partition's checkpoint (sweep). Between
// them it re-queues the partitions whose retry delay is over.
func (s *Subscriber) coordinate(ctx context.Context, ps *partitionSet, scanned int64) {
	timer := time.NewTimer(s.pollInterval)
	defer timer.Stop()
	wake := s.wake
	names := s.partitionNames()
	nextPoll := time.Now().Add(s.pollInterval)
	// Quick re-probes after a wake that found nothing, as in Run: rechecks
	// counts them, -1 when no wake is followed up.
	rechecks, nextRecheck := -1, time.Time{}
	for {
		now := time.Now()
		next := nextPoll
		if rechecks >= 0 && nextRecheck.Before(next) {
			next = nextRecheck
		}
		if r := ps.earliestRetry(); !r.IsZero() && r.Before(next) {
			next = r
		}
		timer.Reset(max(next.Sub(now), 0))
		woken := false
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case _, ok := <-wake:
			timer.Stop() // Go 1.23+: no stale tick is delivered after Stop
			if !ok {
				s.logger.Warn("subscriber: wake signal channel closed; falling back to polling", "subscriber", s.name, "poll_interval", s.pollInterval)
				wake = nil
				continue
			}
			woken = true
		}
		now = time.Now()
		ps.requeueDue(now)
		recheck := rechecks >= 0 && !now.Before(nextRecheck)
		poll := !now.Before(nextPoll)
		if !woken && !recheck && !poll {
			continue
		}
		found := s.probe(ctx, ps, &scanned)
		if poll {
			s.sweep(ctx, ps, names)
			nextPoll = now.Add(s.pollInterval)
		}
		switch {
		case woken:
			rechecks = 0
		case recheck:
			rechecks++
		}
		if rechecks >= 0 {
			if found || rechecks >= len(wakeRechecks) {
				rechecks = -1
			} else {
				nextRecheck = now.Add(wakeRechecks[rechecks])
			}
		}
	}
}

// earliestRetry returns the earliest retry time of an unclaimed
// partition, zero if none waits.
func (ps *partitionSet) earliestRetry() time.Time {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var first time.Time
	for _, st := range ps.parts {
		if !st.retryAt.IsZero() && !st.claimed && (first.IsZero() || st.retryAt.Before(first)) {
			first = st.retryAt
		}
	}
	return first
}

// requeueDue queues the partitions whose retry time has come.
func (ps *partitionSet) requeueDue(now time.Time) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for p, st := range ps.parts {
		if !st.retryAt.IsZero() && !st.claimed && !now.Before(st.retryAt) {
			st.retryAt = time.Time{}
			// No re-read of the checkpoint: the batch's lock returns its
			// position (runner.cycle reads again from a moved one), and a
			// failure that left it unknown reads it anyway (known < 0).
			ps.mark(p, false)
		}
	}
}

// probe reads the feed past scanned and marks the partitions that got
// events; it reports whether there were any.
func (s *Subscriber) probe(ctx context.Context, ps *partitionSet, scanned *int64) bool {
	parts, all, next, err := s.scanFeed(ctx, *scanned)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Error("subscriber: reading the feed failed; will retry", "subscriber", s.name, "error", err)
		}
		return false
	}
	if next == *scanned {
		return false
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if all {
		for p := range ps.parts {
			ps.mark(p, false)
		}
	}
	for _, p := range parts {
		ps.mark(p, false)
	}
	*scanned = next
	return true
}

// scanFeed reads the feed past scanned (one statement, at most
// partitionProbeLimit events) and returns the partitions that got events
// and the position the next scan starts after (scanned when there was
// none). Past the limit it returns all instead: a backlog, in which every
// partition with events reads until it is idle, so that marking them all
// covers everything up to the head, where the next scan starts. The
// coordinator of a partitioned Run and a Group's scan of a partitioned
// definition share it.
func (s *Subscriber) scanFeed(ctx context.Context, scanned int64) (parts []int, all bool, next int64, err error) {
	events, err := s.events.ReadAfter(ctx, scanned, partitionProbeLimit)
	if err != nil || len(events) == 0 {
		return nil, false, scanned, err
	}
	last := events[len(events)-1].Position
	if len(events) == partitionProbeLimit {
		head, err := s.events.HeadPosition(ctx)
		if err != nil {
			head = last
		}
		return nil, true, max(last, head), nil
	}
	seen := make(map[int]bool)
	for _, ev := range events {
		if p := PartitionOf(ev.AggregateID, s.partitions); !seen[p] {
			seen[p] = true
			parts = append(parts, p)
		}
	}
	return parts, false, last, nil
}

// sweep reads every partition's checkpoint, and the partition count, in
// one statement: a partition whose checkpoint moved since this process
// last saw it (a reset, another replica's batch) is looked at again, and
// a count changed by a Repartition ends the Run (ErrPartitionsChanged),
// idle partitions included.
func (s *Subscriber) sweep(ctx context.Context, ps *partitionSet, names []string) {
	positions, err := s.checkpointPositions(ctx, names)
	if err == nil && slices.Contains(positions, RetiredCheckpoint) {
		err = s.retiredError(ctx, names[slices.Index(positions, RetiredCheckpoint)])
	}
	if errors.Is(err, ErrPartitionsChanged) {
		ps.mu.Lock()
		if ps.fatal == nil {
			ps.fatal = err
		}
		ps.mu.Unlock()
		ps.abort()
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Error("subscriber: reading the partition checkpoints failed; will retry", "subscriber", s.name, "error", err)
		}
		return
	}
	if ps.index != nil {
		ps.index.rewind(slices.Min(positions), slices.Max(positions))
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for p, st := range ps.parts {
		if !st.claimed && st.retryAt.IsZero() && st.seen != positions[p] {
			// The position just read is the one the partition's next
			// batch would read: hand it over (no worker holds r while the
			// partition is unclaimed; take orders it before the batch).
			st.r.known, st.seen = positions[p], positions[p]
			ps.mark(p, false)
		}
	}
}
