package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/eventfeed/subscriptions/domain"
)

// RetiredCheckpoint is the position Repartition leaves in the checkpoint
// rows of the layout it replaces: past any event, so that a process still
// running that layout reads nothing more. This version's run loop stops
// with ErrPartitionsChanged when it meets it (at its next batch or poll);
// an older one idles. A store that implements Repartitioner writes it.
const RetiredCheckpoint int64 = math.MaxInt64

// unpartitionedCount is what the row of the partition count
// (partitionMarker) holds once a name was repartitioned to run
// unpartitioned, so that a partitioned Run of it is refused as after any
// other change of count (0, no row, means no count is recorded).
const unpartitionedCount = -1

// repartitionCatchUpLimit bounds the events a Repartition handles to bring
// the lagging partitions to the common position: they are read first and
// then handled in the repartition's one transaction, which holds every
// partition meanwhile. repartitionScanLimit bounds the events it reads of
// the shared feed to find them (see catchUpPlan), and
// repartitionReadChunk is one read.
const (
	repartitionCatchUpLimit = 10_000
	repartitionScanLimit    = 200_000
	repartitionReadChunk    = 1_000
)

// Repartitioner is the optional capability of a CheckpointStore that
// changes a name's partition layout in one transaction, for
// Subscriber.Repartition (without it Repartition fails with
// errors.ErrUnsupported). This package's stores have it;
// subscriptionstest.RunRepartitionerSuite checks a store of your own.
type Repartitioner interface {
	// Repartition holds off every batch of the rows from and to, of any
	// replica, as ResetAll does (waiting for the batches in flight, or on
	// SQLite ending them), and reads, under that hold, the count recorded
	// in the row marker and the checkpoints of from (0 for a missing row;
	// a missing row of from is created, so that no batch can create and
	// run it meanwhile), with their delivery marks. catchUp gets them and
	// returns the common position and apply, which runs in the same
	// transaction on a context that carries it as a batch's
	// HandlerContext does. Then, still in that transaction, every row of
	// to is set to the position, with the lowest redelivery mark of from
	// (a store with DeliveryMarker: see RepartitionRows), every row of from
	// not in to to RetiredCheckpoint, their attempt records are cleared,
	// marker is set to count, and it commits. An error of catchUp or
	// apply, a cancelled ctx or a crash changes nothing.
	//
	// A store that holds a connection of its pool while catchUp runs (a
	// transaction, on Postgres) passes it read, its own feed read in that
	// transaction, so that catchUp reads a feed the store shares
	// (FeedSharer) without a second connection of the pool (doc.go,
	// Connections); other stores pass nil. Safe for concurrent use.
	Repartition(ctx context.Context, marker string, from, to []string, count int64, catchUp RepartitionCatchUp) error
}

// RepartitionRows is what a Repartitioner reads of the layout it holds,
// for RepartitionCatchUp.
type RepartitionRows struct {
	// Recorded is the position of the count's row: the count recorded.
	Recorded int64
	// Positions are the checkpoints of from, in from's order.
	Positions []int64
	// Marks are their delivery marks as a batch of each row reads them
	// (MarkedBatch), in from's order; nil for a store without
	// DeliveryMarker. The catch-up delivers each partition's events under
	// its own marks; a row of to gets the lowest RedeliveredThrough of
	// them (LowestRedelivery; the package documentation, Replays and live
	// traffic, says why).
	Marks []DeliveryMarks
}

// LowestRedelivery is the redelivery mark a Repartitioner gives the rows
// of the new layout: the lowest of Marks (0 without them).
func (r RepartitionRows) LowestRedelivery() int64 {
	if len(r.Marks) == 0 {
		return 0
	}
	low := r.Marks[0].RedeliveredThrough
	for _, m := range r.Marks[1:] {
		low = min(low, m.RedeliveredThrough)
	}
	return low
}

// RepartitionCatchUp is the Subscriber's part of Repartitioner.Repartition:
// given the rows read under the hold and read, the position to write and
// the statements that bring every row of from to it.
type RepartitionCatchUp func(ctx context.Context, rows RepartitionRows, read RepartitionFeed) (position int64, apply func(ctx context.Context) error, err error)

// RepartitionFeed reads, in a repartition's transaction, up to limit
// events of the store's own feed with after < position <= upTo, in
// position order. upTo is a checkpoint, so every position up to it has
// committed.
type RepartitionFeed func(ctx context.Context, after, upTo int64, limit int) ([]domain.EventEnvelope[any], error)

// Repartition changes the name's partition count to n (0: unpartitioned;
// 1 is one partition, a layout like any other) without a rebuild. It holds
// off every batch of the name, in every process, brings every partition
// to one position T, the highest of their checkpoints (the partitions
// behind it handle their events up to T, nothing past it, with this
// Subscriber's handler), and writes the checkpoints of the n new
// partitions at T, the retired ones (RetiredCheckpoint) and the new count,
// all in that one transaction. Nothing is skipped or handled twice, and
// each aggregate's events stay in feed order: up to T in its old
// partition, after T in its new one. A crash or an error leaves the old
// layout as it was.
//
// Replicas still running the old count stop with ErrPartitionsChanged at
// their next batch or poll, having handled nothing past T; start them
// again with WithPartitions(n) (or without it for 0). s may be built with
// any count: Repartition reads the recorded one. Repartitioning to the
// recorded count does nothing.
//
// The catch-up runs in the transaction, so it is bounded (10,000 events;
// beyond that, or when the name is paused and partitions lag, it refuses
// and changes nothing: let the partitions catch up first); on SQLite it
// holds the write lock meanwhile, as a batch does, and appends wait for
// it. It must not be called from a handler of the name. It needs a checkpoint store with
// Repartitioner (this package's; otherwise the error wraps
// errors.ErrUnsupported). Safe for concurrent use. See docs/partitions.md.
func (s *Subscriber) Repartition(ctx context.Context, n int) error {
	what := fmt.Sprintf("subscriptions: repartition %q to %d partitions", s.name, n)
	if n < 0 || n > MaxPartitions {
		return fmt.Errorf("%s: the count must be between 0 (unpartitioned) and %d", what, MaxPartitions)
	}
	if n > 0 {
		if err := validateName(partitionName(s.name, n-1, n)); err != nil {
			return fmt.Errorf("%s: partition checkpoint: %w", what, err)
		}
	}
	rp, ok := s.checkpoints.(Repartitioner)
	if !ok {
		return fmt.Errorf("%s: checkpoint store %T cannot change the partition count: %w", what, s.checkpoints, errors.ErrUnsupported)
	}
	marker := partitionMarker(s.name)
	recorded, err := s.storePositions(ctx, []string{marker})
	if err != nil {
		return err // the store names the checkpoint
	}
	m := recordedCount(recorded[0])
	if m == n {
		return nil
	}
	// A checkpoint past the feed head is refused: every partition would
	// skip the events appended up to it. Checked before the hold (which
	// may keep the pool's only connection): batches move checkpoints only
	// to events that exist.
	before, err := s.storePositions(ctx, s.layoutNames(m))
	if err != nil {
		return err
	}
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		return fmt.Errorf("%s: read the feed head: %w", what, err)
	}
	if high := slices.Max(before); high > head && high != RetiredCheckpoint {
		return fmt.Errorf("%s: a checkpoint is at %d, feed head %d: %w", what, high, head, ErrCheckpointAhead)
	}
	paused := false
	if p, ok := s.checkpoints.(Pauser); ok {
		if _, paused, err = p.PausedSince(ctx, s.name); err != nil {
			return err // the store names the subscriber
		}
	}
	count := int64(n)
	if n == 0 {
		count = unpartitionedCount
	}
	var target int64
	var caughtUp int
	var cleared []clearRange
	step := fmt.Sprintf("from %d to %d partitions", m, n)
	// The store's read of its own feed, for the events' store only.
	shared := false
	if sharer, ok := s.checkpoints.(FeedSharer); ok {
		shared = sharer.SharesFeed(undecorated(s.events))
	}
	err = rp.Repartition(ctx, marker, s.layoutNames(m), s.layoutNames(n), count, func(ctx context.Context, rows RepartitionRows, read RepartitionFeed) (int64, func(context.Context) error, error) {
		if now := recordedCount(rows.Recorded); now != m {
			return 0, nil, fmt.Errorf("%s: the count changed meanwhile (to %d): %w", step, now, ErrPartitionsChanged)
		}
		if !shared {
			read = nil
		}
		plan, err := s.catchUpPlan(ctx, m, rows, read)
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", step, err)
		}
		if plan.events > 0 && paused {
			return 0, nil, fmt.Errorf("%s: %q is paused and %d events of its partitions lie behind position %d: resume it, let them catch up, then repartition", step, s.name, plan.events, plan.target)
		}
		target, caughtUp = plan.target, plan.events
		return plan.target, func(hctx context.Context) error {
			// In the repartition's transaction (hctx): on SQLite the lot
			// cannot be read beside it.
			if err := s.refuseHeldCatchUp(hctx, plan); err != nil {
				return fmt.Errorf("%s: %w", step, err)
			}
			var err error
			if cleared, err = s.catchUp(hctx, m, plan); err != nil {
				return fmt.Errorf("%s: catch up to position %d: %w", step, plan.target, err)
			}
			return nil
		}, nil
	})
	if err != nil {
		return err // the store names the subscriber; nothing changed
	}
	for _, c := range cleared {
		if err := c.clear(ctx); err != nil {
			s.logger.Error("subscriber: removing the parked entries of delivered events failed; they stay listed", "subscriber", s.name, "error", err)
		}
	}
	s.logger.Info("subscriber repartitioned", "subscriber", s.name, "from", m, "to", n, "position", target, "caught_up", caughtUp)
	return nil
}

// layoutRows are the rows a repartition holds (Repartitioner): marker,
// from and to, sorted, each once; this package's stores hold them in that
// order.
func layoutRows(marker string, from, to []string) []string {
	all := append(append([]string{marker}, from...), to...)
	slices.Sort(all)
	return slices.Compact(all)
}

// recordedCount is the partition count a row of the partition count
// records: 0 for none or unpartitioned.
func recordedCount(marker int64) int {
	return int(max(marker, 0))
}

// layoutNames are the checkpoint rows of the name with n partitions: the
// name's own row for 0.
func (s *Subscriber) layoutNames(n int) []string {
	if n == 0 {
		return []string{s.name}
	}
	names := make([]string, n)
	for p := range names {
		names[p] = partitionName(s.name, p, n)
	}
	return names
}

// catchUpPlan is what a Repartition handles: target, the highest
// checkpoint of the m partitions, and per partition behind it its events
// up to target.
type catchUpPlan struct {
	target    int64
	positions []int64
	marks     []DeliveryMarks // per partition; nil without DeliveryMarker
	lagging   map[int][]domain.EventEnvelope[any]
	events    int
}

// catchUpPlan reads, once every partition is held, the events of the m
// partitions (at rows.Positions) up to the highest of their checkpoints. Every
// event up to it is committed: it is the position of one the feed
// returned. With read (a feed the checkpoint store shares, read in its
// transaction) it reads the feed from the lowest checkpoint on and keeps
// each partition's events past its checkpoint; otherwise each lagging
// partition's events through the event store.
func (s *Subscriber) catchUpPlan(ctx context.Context, m int, rows RepartitionRows, read RepartitionFeed) (catchUpPlan, error) {
	positions := rows.Positions
	plan := catchUpPlan{target: slices.Max(positions), positions: positions, marks: rows.Marks, lagging: map[int][]domain.EventEnvelope[any]{}}
	if slices.Contains(positions, RetiredCheckpoint) {
		return plan, fmt.Errorf("a checkpoint of the recorded layout is retired (%d): %w", RetiredCheckpoint, ErrPartitionsChanged)
	}
	if m == 0 {
		return plan, nil
	}
	keep := func(p int, ev domain.EventEnvelope[any]) error {
		plan.lagging[p] = append(plan.lagging[p], ev)
		if plan.events++; plan.events > repartitionCatchUpLimit {
			return fmt.Errorf("more than %d events of the partitions lie behind position %d: let them catch up (PartitionLags), then repartition", repartitionCatchUpLimit, plan.target)
		}
		return nil
	}
	if read != nil {
		scanned := 0
		for after := slices.Min(positions); after < plan.target; {
			events, err := read(ctx, after, plan.target, repartitionReadChunk)
			if err != nil {
				return plan, fmt.Errorf("read the feed after position %d: %w", after, err)
			}
			for _, ev := range events {
				if p := PartitionOf(ev.AggregateID, m); ev.Position > positions[p] {
					if err := keep(p, ev); err != nil {
						return plan, err
					}
				}
			}
			if scanned += len(events); scanned > repartitionScanLimit {
				return plan, fmt.Errorf("the partitions lie more than %d events apart, behind position %d: let them catch up (PartitionLags), then repartition", repartitionScanLimit, plan.target)
			}
			if len(events) < repartitionReadChunk {
				break
			}
			after = events[len(events)-1].Position
		}
		return plan, nil
	}
	for p, from := range positions {
		feed := newPartitionFeed(s.events, p, m)
		for after := from; after < plan.target; {
			events, err := feed.ReadAfter(ctx, after, s.batchSize)
			if err != nil {
				return plan, err // the feed names the partition
			}
			for _, ev := range events {
				if ev.Position > plan.target {
					break
				}
				if err := keep(p, ev); err != nil {
					return plan, err
				}
				after = ev.Position
			}
			if len(events) < s.batchSize || events[len(events)-1].Position > plan.target {
				break
			}
		}
	}
	return plan, nil
}

// refuseHeldCatchUp refuses a catch-up that would hand a handler an event
// of an aggregate with an earlier event parked (WithOrderedParking): the
// catch-up does not hold events behind their queue's head as a batch does.
func (s *Subscriber) refuseHeldCatchUp(ctx context.Context, plan catchUpPlan) error {
	if s.queues == nil || plan.events == 0 {
		return nil
	}
	heads, err := s.queues.lot.ParkedHeads(ctx, s.queues.name)
	if err != nil {
		return fmt.Errorf("read the parked aggregates' queues: %w", err)
	}
	at := make(map[string]int64, len(heads))
	for _, h := range heads {
		at[h.AggregateID] = h.Position
	}
	for _, events := range plan.lagging {
		for _, ev := range events {
			if head, ok := at[ev.AggregateID]; ok && ev.AggregateID != "" && head < ev.Position {
				return fmt.Errorf("event %q (position %d) of aggregate %q lies behind its parked event at position %d, which the catch-up cannot hold it behind: replay or discard that one, or let the partitions catch up, then repartition: %w",
					ev.ID, ev.Position, ev.AggregateID, head, ErrParkedBehindHead)
			}
		}
	}
	return nil
}

// clearRange is the removal of the parked entries of a partition's events
// the catch-up delivered, for a lot that cannot remove them in the
// transaction (after it commits, as a batch does).
type clearRange struct {
	clearer   DeliveredClearer
	name      string
	after, to int64
}

func (c clearRange) clear(ctx context.Context) error {
	return c.clearer.ClearDelivered(ctx, c.name, c.after, c.to)
}

// catchUp handles plan's events, partition by partition in feed order, on
// hctx (the repartition's transaction), through the BatchHandler in slices
// of the batch size when there is one, and removes their parked entries as
// a live batch does (in the transaction where the lot can, or returned for
// after the commit). The first failure ends it: the transaction rolls
// back.
func (s *Subscriber) catchUp(hctx context.Context, m int, plan catchUpPlan) ([]clearRange, error) {
	var after []clearRange
	for p := range m {
		events := plan.lagging[p]
		if len(events) == 0 {
			continue
		}
		var marks DeliveryMarks
		if plan.marks != nil {
			marks = plan.marks[p]
		}
		if err := s.handleCatchUp(hctx, marks, events); err != nil {
			return nil, fmt.Errorf("partition %d of %d: %w", p, m, err)
		}
		lot, ok := s.clearer.(PartitionDeliveredClearer)
		if !ok {
			continue
		}
		c := clearRange{clearer: partitionClearer{lot: lot, name: s.name, partition: p, partitions: m}, name: s.name,
			after: plan.positions[p], to: events[len(events)-1].Position}
		if !lot.ClearsInBatch(hctx) {
			after = append(after, c)
			continue
		}
		if err := c.clear(hctx); err != nil {
			return nil, fmt.Errorf("partition %d of %d: remove the parked entries of delivered events: %w", p, m, err)
		}
	}
	return after, nil
}

// handleCatchUp runs the handler (with WithHandlerTimeout's deadline) on
// events, under their partition's delivery marks as a batch of it would:
// the BatchHandler gets them in slices of the batch size that end where
// the delivery changes.
func (s *Subscriber) handleCatchUp(hctx context.Context, marks DeliveryMarks, events []domain.EventEnvelope[any]) error {
	call := func(d Delivery, run func(ctx context.Context) error) error {
		ctx := withDelivery(hctx, d)
		if s.handlerTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, s.handlerTimeout, ErrHandlerTimeout)
			defer cancel()
		}
		return run(ctx)
	}
	if s.batchHandler != nil {
		for rest := events; len(rest) > 0; {
			d, chunk := marks.same(rest[:min(len(rest), s.batchSize)])
			rest = rest[len(chunk):]
			if err := call(d, func(ctx context.Context) error { return s.batchHandler(ctx, chunk) }); err != nil {
				return fmt.Errorf("events at positions %d to %d: %w", chunk[0].Position, chunk[len(chunk)-1].Position, err)
			}
		}
		return nil
	}
	for _, ev := range events {
		d, _ := marks.at(ev.Position)
		if err := call(d, func(ctx context.Context) error { return s.handler(ctx, ev) }); err != nil {
			return fmt.Errorf("event %s (%s) at position %d: %w", ev.ID, ev.EventType, ev.Position, err)
		}
	}
	return nil
}

// retiredError is the error of a runner (of s, or of a partition of it)
// whose checkpoint row name was retired by a Repartition: the name's
// count as now recorded (partitionCountIs), or, when that cannot be read
// or says nothing, the retirement itself. Either wraps
// ErrPartitionsChanged.
func (s *Subscriber) retiredError(ctx context.Context, name string) error {
	owner := s
	if s.parent != nil {
		owner = s.parent
	}
	err := owner.checkPartitionCount(ctx)
	if errors.Is(err, ErrPartitionsChanged) {
		return err
	}
	retired := fmt.Errorf("subscriptions: subscriber %q: checkpoint %q was retired by a repartition: %w", owner.name, name, ErrPartitionsChanged)
	if err != nil {
		return errors.Join(retired, err)
	}
	return retired
}
