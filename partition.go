package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/eventfeed/subscriptions/internal/partition"
)

// MaxPartitions bounds WithPartitions. Each partition is one checkpoint row
// and one runner; past a few hundred the per-partition bookkeeping costs
// more than the parallelism buys on any database this module supports.
const MaxPartitions = 1024

// ErrPartitionsChanged is returned by Run, ResetCheckpoint,
// ResetCheckpointWith, DeleteState, WaitCaughtUp, Lag, PartitionLags,
// Status and Healthy of a subscriber whose name has checkpoints recorded
// for another number of partitions (WithPartitions, or none), before
// anything is changed, and by a Run whose name is repartitioned while it
// runs, at its next batch or poll. Running with another n would hand the
// aggregates to other partitions, whose checkpoints are elsewhere in the
// feed: events would be skipped or handled twice; resetting or deleting
// would move rows the name's runs do not use. Keep the recorded n, or
// change it with Repartition (see docs/partitions.md).
var ErrPartitionsChanged = errors.New("the subscriber's checkpoints were written for another number of partitions")

// WithPartitions splits the feed into n partitions by a stable hash of the
// aggregate ID (PartitionOf), each with its own checkpoint, so that up to n
// batches of one subscriber run at once: in this process (WithConcurrency)
// and in every replica of the name. n must be between 1 and MaxPartitions.
//
// Events of one aggregate stay in feed order; events of different
// aggregates may be handled out of global order. See doc.go ("Partitions")
// for the guarantees and docs/partitions.md for when to partition and how
// to change n.
func WithPartitions(n int) SubscriberOption {
	return func(s *Subscriber) { s.partitions = n }
}

// WithConcurrency sets how many partitions a partitioned subscriber
// processes at once in this process (default 1): Run starts k worker
// goroutines, each taking any partition with work whose checkpoint it can
// acquire. It requires WithPartitions; k must be between 1 and the number
// of partitions.
func WithConcurrency(k int) SubscriberOption {
	return func(s *Subscriber) { s.concurrency = k }
}

// PartitionOf returns the partition, in [0, n), that WithPartitions(n)
// assigns an aggregate: the first four bytes of the MD5 digest of the
// aggregate ID's UTF-8 bytes, read as a big-endian unsigned integer,
// modulo n. The same function is computed in SQL where the engine has MD5
// (dialect.PartitionHash: Postgres); MD5 is fixed by RFC 1321, so the assignment is the
// same in every version of Go, of Postgres and of this module. It returns
// 0 when n < 1.
func PartitionOf(aggregateID string, n int) int { return partition.Of(aggregateID, n) }

// partitionName is the checkpoint name of partition p of n. It names n so
// that checkpoints of different partition counts never share a row.
func partitionName(name string, p, n int) string {
	return fmt.Sprintf("%s/partition-%d-of-%d", name, p, n)
}

// partitionMarker is the checkpoint row that records a partitioned name's
// partition count (its position holds n), so that a Run with another n is
// refused.
func partitionMarker(name string) string { return name + "/partitions" }

// internalName matches the names of a partitioned subscriber's own
// checkpoint rows (partitionName, partitionMarker).
var internalName = regexp.MustCompile(`/(partitions|partition-[0-9]+-of-[0-9]+)$`)

// PauseKey is the name a checkpoint row is paused under (see Pauser): a
// partitioned subscriber's rows (named after it, with a suffix that
// NewSubscriber reserves) under the subscriber's name, any other row under
// its own.
func PauseKey(checkpoint string) string {
	if loc := internalName.FindStringIndex(checkpoint); loc != nil {
		return checkpoint[:loc[0]]
	}
	return checkpoint
}

// reservedName refuses a subscriber name that ends like a partitioned
// subscriber's own checkpoint rows: a subscriber of that name would share
// another's checkpoint (starting from its position, and making the
// partitioned subscriber refuse to run).
func reservedName(name string) error {
	if m := internalName.FindString(name); m != "" {
		return fmt.Errorf("%q ends in %q, which is reserved: names ending in /partitions or /partition-P-of-N name the checkpoints of partitioned subscribers", name, m)
	}
	return nil
}

// partitionNames lists the checkpoint names of every partition.
func (s *Subscriber) partitionNames() []string {
	names := make([]string, s.partitions)
	for p := range names {
		names[p] = partitionName(s.name, p, s.partitions)
	}
	return names
}

func (s *Subscriber) validatePartitions() error {
	switch {
	case s.partitions < 0 || s.partitions > MaxPartitions:
		return fmt.Errorf("partitions %d must be between 1 and %d (WithPartitions)", s.partitions, MaxPartitions)
	case s.concurrency < 0:
		return fmt.Errorf("concurrency %d must be positive (WithConcurrency)", s.concurrency)
	case s.concurrency > 0 && s.partitions == 0:
		return fmt.Errorf("concurrency %d needs partitions (WithPartitions)", s.concurrency)
	case s.concurrency > s.partitions:
		return fmt.Errorf("concurrency %d exceeds the %d partitions (WithConcurrency)", s.concurrency, s.partitions)
	}
	if s.partitions > 0 {
		// The longest derived name must fit where subscriber names are kept.
		if err := validateName(partitionName(s.name, s.partitions-1, s.partitions)); err != nil {
			return fmt.Errorf("name: partition checkpoint: %w", err)
		}
	}
	return nil
}

// PartitionCheckpointStore is the optional capability of a
// CheckpointStore that reads and changes several checkpoint rows at once:
// a partitioned subscriber's partitions and the row that records their
// count. With it every partition's checkpoint is read in one statement
// (the coordinator's sweep, Status, Lag), a reset or delete moves every
// partition in one transaction, checking the recorded count inside it,
// and replicas starting at once seed the partitions once. Without it a
// partitioned subscriber reads the rows one by one, a reset moves them one
// after the other (a reader may see some moved and some not; the count is
// checked before, not inside), two replicas starting for the first time at
// once may both seed the partitions, and ResetCheckpointWith and
// DeleteState of a partitioned subscriber are refused
// (errors.ErrUnsupported). This package's stores have it.
type PartitionCheckpointStore interface {
	// Positions returns the committed checkpoints of names (0 for a name
	// without one) in one read; through the transaction in ctx when it is
	// one of the store's own (a reset's guard).
	Positions(ctx context.Context, names []string) ([]int64, error)
	// ResetAll sets every named checkpoint to position atomically,
	// serialized against in-flight batches as Reset is (with a nil apply)
	// or as CheckpointResetter.ResetWith is, apply included. guard runs
	// first, once the batches are held off, on ctx with the transaction
	// (where there is one); its error changes nothing and is returned.
	ResetAll(ctx context.Context, names []string, position int64, guard, apply func(ctx context.Context) error) error
	// DeleteAll deletes every named checkpoint (their attempt records and
	// pauses too) and runs apply atomically, as CheckpointResetter.Delete
	// does, guard first as for ResetAll, before anything is deleted.
	DeleteAll(ctx context.Context, names []string, guard, apply func(ctx context.Context) error) error
	// InitPartitions records n in the row marker unless it already holds a
	// count, which it then returns (0 when it recorded n); on first use it
	// seeds every partition of parts that has no row yet, or a retired one
	// (RetiredCheckpoint), at plain's checkpoint (0 when retired), in the
	// same transaction.
	InitPartitions(ctx context.Context, marker, plain string, parts []string, n int64) (int64, error)
}

// storePositions reads the checkpoints of names through ps when the store
// has it, one by one otherwise.
func (s *Subscriber) storePositions(ctx context.Context, names []string) ([]int64, error) {
	if ps, ok := s.checkpoints.(PartitionCheckpointStore); ok {
		return ps.Positions(ctx, names)
	}
	out := make([]int64, len(names))
	for i, name := range names {
		p, err := s.checkpoints.Position(ctx, name)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// initPartitions checks the name's partition count and seeds the
// partitions on first use; see partitionStore.initPartitions.
func (s *Subscriber) initPartitions(ctx context.Context) error {
	marker, n := partitionMarker(s.name), int64(s.partitions)
	parts := s.partitionNames()
	var existing int64
	if ps, ok := s.checkpoints.(PartitionCheckpointStore); ok {
		var err error
		if existing, err = ps.InitPartitions(ctx, marker, s.name, parts, n); err != nil {
			return err
		}
	} else {
		var err error
		if existing, err = s.checkpoints.Position(ctx, marker); err != nil {
			return err
		}
		if existing == 0 {
			plain, err := s.checkpoints.Position(ctx, s.name)
			if err != nil {
				return err
			}
			for _, part := range parts {
				if plain == 0 {
					break
				}
				if err := s.checkpoints.Reset(ctx, part, plain); err != nil {
					return err
				}
			}
			if err := s.checkpoints.Reset(ctx, marker, n); err != nil {
				return err
			}
		}
	}
	return s.partitionCountIs(existing)
}

// partitionCountIs returns the error of every call on a name whose
// recorded partition count (recorded: 0 for none) is not this
// Subscriber's: Run, the resets, DeleteState, WaitCaughtUp, Lag and
// Status all refuse, before anything is changed or any of the
// application's statements runs, since they would read or move
// checkpoints the name's runs do not use.
func (s *Subscriber) partitionCountIs(recorded int64) error {
	switch {
	case recorded == 0 || recorded == int64(s.partitions):
		return nil
	case recorded < 0: // repartitioned to unpartitioned
		if s.partitions == 0 {
			return nil
		}
		return fmt.Errorf("subscriptions: subscriber %q has unpartitioned checkpoints (repartitioned), WithPartitions(%d) given: %w; construct it without WithPartitions, or Repartition it",
			s.name, s.partitions, ErrPartitionsChanged)
	case s.partitions == 0:
		return fmt.Errorf("subscriptions: subscriber %q has checkpoints for %d partitions, WithPartitions not given: %w; construct it with WithPartitions(%d)",
			s.name, recorded, ErrPartitionsChanged, recorded)
	}
	return fmt.Errorf("subscriptions: subscriber %q has checkpoints for %d partitions, WithPartitions(%d) given: %w; run it with WithPartitions(%d), or Repartition it to %d",
		s.name, recorded, s.partitions, ErrPartitionsChanged, recorded, s.partitions)
}

// checkPartitionCount reads the name's recorded partition count and
// refuses a Subscriber built with another one (partitionCountIs). In a
// reset's or delete's guard it reads through the transaction in ctx.
func (s *Subscriber) checkPartitionCount(ctx context.Context) error {
	recorded, err := s.storePositions(ctx, []string{partitionMarker(s.name)})
	if err != nil {
		return err // the store names the checkpoint
	}
	return s.partitionCountIs(recorded[0])
}

// countGuard is checkPartitionCount as the stores' guard of a reset or a
// delete: it runs once the batches in flight are held off (on SQLite the
// batch in flight, which may hold the only connection, is ended first),
// inside the change's transaction, before the application's statements.
func (s *Subscriber) countGuard(ctx context.Context) error {
	if err := s.checkPartitionCount(ctx); err != nil {
		return &stepError{step: "check the partition count", err: err}
	}
	return nil
}

// guarded returns apply preceded by guard (apply may be nil).
func guarded(guard, apply func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if err := guard(ctx); err != nil {
			return err
		}
		if apply == nil {
			return nil
		}
		return apply(ctx)
	}
}

// checkpointPositions reads the checkpoints of names and the name's
// partition count in one read where the store allows, and refuses a
// Subscriber built with another count (partitionCountIs).
func (s *Subscriber) checkpointPositions(ctx context.Context, names []string) ([]int64, error) {
	positions, err := s.storePositions(ctx, append(slices.Clone(names), partitionMarker(s.name)))
	if err != nil {
		return nil, err
	}
	last := len(positions) - 1
	if err := s.partitionCountIs(positions[last]); err != nil {
		return nil, err
	}
	return positions[:last], nil
}

// PartitionLags returns, per partition, how many events of the partition
// lie past its checkpoint; Lag returns their sum. It returns nil for an
// unpartitioned subscriber. A checkpoint past the feed head is an error
// wrapping ErrCheckpointAhead, as for Lag.
func (s *Subscriber) PartitionLags(ctx context.Context) ([]int64, error) {
	if s.partitions == 0 {
		return nil, nil
	}
	positions, err := s.checkpointPositions(ctx, s.partitionNames())
	if err != nil {
		return nil, err // the store names the subscriber
	}
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: lag of %q: %w", s.name, err)
	}
	lags := make([]int64, s.partitions)
	for p, position := range positions {
		if position > head {
			return nil, fmt.Errorf("subscriptions: lag of %q: partition %d of %d: checkpoint %d, feed head %d: %w", s.name, p, s.partitions, position, head, ErrCheckpointAhead)
		}
		n, err := newPartitionFeed(s.events, p, s.partitions).countAfter(ctx, position, head)
		if err != nil {
			return nil, fmt.Errorf("subscriptions: lag of %q: partition %d of %d: %w", s.name, p, s.partitions, err)
		}
		lags[p] = n
	}
	return lags, nil
}

// partitionedLag is Lag for a partitioned subscriber: the events not yet
// handled, summed over the partitions.
func (s *Subscriber) partitionedLag(ctx context.Context) (int64, error) {
	lags, err := s.PartitionLags(ctx)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, l := range lags {
		total += l
	}
	return total, nil
}

// resetPartitions is ResetCheckpoint for a partitioned subscriber: every
// partition moves to position in one transaction (see partitionStore).
func (s *Subscriber) resetPartitions(ctx context.Context, position int64) error {
	names := s.partitionNames()
	if ps, ok := s.checkpoints.(PartitionCheckpointStore); ok {
		return ps.ResetAll(ctx, names, position, s.countGuard, nil)
	}
	// Without the capability the count is checked before, not inside.
	if err := s.checkPartitionCount(ctx); err != nil {
		return err
	}
	for _, name := range names {
		if err := s.checkpoints.Reset(ctx, name, position); err != nil {
			return err
		}
	}
	return nil
}

// partitionLot records a partition's parked events under the subscriber's
// own name, so that ListParked and ReplayParked see every partition's.
type partitionLot struct {
	ParkingLot
	name string
}

func (l partitionLot) Park(ctx context.Context, parked ParkedEvent) error {
	parked.Subscriber = l.name
	return l.ParkingLot.Park(ctx, parked)
}

// resetPartitionsWith is ResetCheckpointWith for a partitioned subscriber:
// apply and every partition's move in one transaction.
func (s *Subscriber) resetPartitionsWith(ctx context.Context, position int64, apply func(ctx context.Context) error) error {
	ps, ok := s.checkpoints.(PartitionCheckpointStore)
	if !ok {
		return fmt.Errorf("subscriptions: reset %q to %d with the application's statements: checkpoint store %T cannot move partitions atomically: %w", s.name, position, s.checkpoints, errors.ErrUnsupported)
	}
	return ps.ResetAll(ctx, s.partitionNames(), position, s.countGuard, apply)
}

// deletePartitions is DeleteState's checkpoint part for a partitioned
// subscriber: every partition's row, the partition count and the name's
// own row (a seed for the partitions, or retired by Repartition), with
// purge, in one transaction.
func (s *Subscriber) deletePartitions(ctx context.Context, purge func(ctx context.Context) error) error {
	ps, ok := s.checkpoints.(PartitionCheckpointStore)
	if !ok {
		return fmt.Errorf("subscriptions: delete the state of %q: checkpoint store %T cannot delete partitions atomically: %w", s.name, s.checkpoints, errors.ErrUnsupported)
	}
	return ps.DeleteAll(ctx, append(s.partitionNames(), partitionMarker(s.name), s.name), s.countGuard, purge)
}

// waitPartitionsCaughtUp is waitCaughtUpTo for a partitioned subscriber:
// it waits until no partition has an event at or below head past its
// checkpoint.
func (s *Subscriber) waitPartitionsCaughtUp(ctx context.Context, head int64) error {
	names := s.partitionNames()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("subscriptions: wait for %q to catch up to position %d: %w", s.name, head, ctx.Err())
		case <-timer.C:
		}
		positions, err := s.storePositions(ctx, names)
		if err != nil {
			if ctx.Err() == nil {
				return err // the store names the subscriber
			}
			continue
		}
		if i := slices.Index(positions, RetiredCheckpoint); i >= 0 {
			return s.retiredError(ctx, names[i]) // repartitioned meanwhile
		}
		behind := false
		for p, position := range positions {
			if position >= head {
				continue
			}
			n, err := newPartitionFeed(s.events, p, s.partitions).countAfter(ctx, position, head)
			if err != nil {
				if ctx.Err() == nil {
					return fmt.Errorf("subscriptions: wait for %q to catch up: partition %d of %d: %w", s.name, p, s.partitions, err)
				}
				break
			}
			if n > 0 {
				behind = true
				break
			}
		}
		if !behind && ctx.Err() == nil {
			return nil
		}
		timer.Reset(min(caughtUpPoll, s.pollInterval))
	}
}

// partitionStatus is status for a partitioned subscriber (see
// Status.Partitions). The checkpoints are read before the head: every
// checkpoint committed by then is at most the head read after it, so a
// batch committing meanwhile never looks like a checkpoint ahead of the
// feed (one ahead is then a real one: a truncated feed, or a reset past
// the head).
func (s *Subscriber) partitionStatus(ctx context.Context) (Status, []time.Time, error) {
	positions, err := s.checkpointPositions(ctx, s.partitionNames())
	if err != nil {
		return Status{}, nil, err // the store names the subscriber
	}
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		return Status{}, nil, fmt.Errorf("subscriptions: status of %q: %w", s.name, err)
	}
	now := time.Now()
	st := Status{Subscriber: s.name, Tenant: s.tenant, Position: head, Head: head, Parked: -1, CheckedAt: now.UTC(), Partitions: make([]PartitionStatus, len(positions))}
	var ahead error
	for p, position := range positions {
		ps := &st.Partitions[p]
		ps.Partition, ps.Position = p, position
		if position > head {
			if ahead == nil {
				st.Position = position
				ahead = fmt.Errorf("subscriptions: status of %q: partition %d of %d: checkpoint %d, feed head %d: %w", s.name, p, s.partitions, position, head, ErrCheckpointAhead)
			}
			continue
		}
		feed := newPartitionFeed(s.events, p, s.partitions)
		n, err := feed.countAfter(ctx, position, head)
		if err != nil {
			return Status{}, nil, fmt.Errorf("subscriptions: status of %q: partition %d of %d: %w", s.name, p, s.partitions, err)
		}
		if n == 0 {
			continue
		}
		ps.Lag = n
		st.Lag += n
		if ahead == nil {
			st.Position = min(st.Position, position)
		}
		if ps.LagSeconds, err = s.lagAge(ctx, feed, position, now); err != nil {
			return Status{}, nil, fmt.Errorf("subscriptions: status of %q: partition %d of %d: %w", s.name, p, s.partitions, err)
		}
		st.LagSeconds = max(st.LagSeconds, ps.LagSeconds)
	}
	if err := s.pausedAndParked(ctx, &st); err != nil {
		return Status{}, nil, err
	}
	progress := s.partitionLive(&st)
	return st, progress, ahead
}

// statePriority orders the partitions' states for the subscriber's own:
// the most pressing wins.
var statePriority = map[State]int{StateIdle: 0, StateRunning: 1, StateRetrying: 2, StateHalted: 3}

// partitionLive fills the live state of st and its partitions from the
// partitions' telemetries (see telemetry.partitions) and returns each
// partition's progress time. A subscriber that is not running here is
// stopped, and so is each of its partitions.
func (s *Subscriber) partitionLive(st *Status) []time.Time {
	whole := s.tel.seen(st.Position, st.Head) // Run's own: started, stopped
	whole.fill(st)
	cells := s.tel.partitionCells()
	progress := make([]time.Time, len(st.Partitions))
	var oldest time.Time
	for p := range st.Partitions {
		ps := &st.Partitions[p]
		progress[p] = whole.progressAt
		if whole.state == StateStopped || len(cells) != len(st.Partitions) {
			ps.State, ps.ProgressAt = StateStopped, whole.progressAt.UTC()
			continue
		}
		live := cells[p].seen(ps.Position, ps.Position+ps.Lag)
		progress[p] = live.progressAt
		ps.State, ps.Failing, ps.Attempts, ps.ProgressAt = live.state, live.failing, live.attempt, live.progressAt.UTC()
		if p == 0 || statePriority[live.state] > statePriority[st.State] {
			st.State, st.Failing, st.Attempts = live.state, live.failing, live.attempt
		}
		if live.lastErrorAt.After(st.LastErrorAt) {
			st.LastError, st.LastErrorAt, st.LastErrorEvent = live.lastError, live.lastErrorAt, live.errorEvent
		}
		if live.lastCommit.After(st.LastCommitAt) {
			st.LastCommitAt = live.lastCommit
		}
		if ps.Lag > 0 && (oldest.IsZero() || live.progressAt.Before(oldest)) {
			oldest = live.progressAt
		}
	}
	if !oldest.IsZero() {
		st.ProgressAt = oldest.UTC()
	}
	return progress
}
