package subscriptions

import (
	"context"
	"fmt"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// This file is what the operator surfaces outside this package (package
// admin, cmd/subscriptions) read beyond Status: the stored event behind a
// parked entry, the feed head, the partition count, and which checkpoints
// Healthy's stuck rule flags.

// Event returns the event with id from the subscriber's event store (the
// event behind a parked entry, say), or an error wrapping
// domain.ErrEventNotFound when the store has none. It is one
// EventStore.GetEventByID; safe for concurrent use, including while Run
// runs, as the store is.
func (s *Subscriber) Event(ctx context.Context, id string) (domain.EventEnvelope[any], error) {
	ev, err := s.events.GetEventByID(ctx, id)
	if err != nil {
		return domain.EventEnvelope[any]{}, fmt.Errorf("subscriptions: event %q of %q's store: %w", id, s.name, err)
	}
	return ev, nil
}

// Head returns the position of the last event of the subscriber's feed
// (EventStore.HeadPosition; 0 for an empty feed): the highest position a
// checkpoint may be reset to without skipping events appended later. Safe
// for concurrent use, as the store is.
func (s *Subscriber) Head(ctx context.Context) (int64, error) {
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		return 0, fmt.Errorf("subscriptions: feed head of %q: %w", s.name, err)
	}
	return head, nil
}

// Partitions returns WithPartitions' count, 0 for an unpartitioned
// subscriber. It is fixed at NewSubscriber, so safe for concurrent use.
func (s *Subscriber) Partitions() int { return s.partitions }

// StuckCheckpoint is one checkpoint row that Healthy's stuck rule flags
// (see StatusStuck): events wait behind it and it has stood still longer
// than allowed.
type StuckCheckpoint struct {
	// Partition is the partition (Status.Partitions' Partition), -1 for an
	// unpartitioned subscriber's only checkpoint.
	Partition int
	// Still is how long the checkpoint has stood still while events wait,
	// measured from the last time this process saw it move or catch up
	// (Status.ProgressAt); Allowed is how long it may: WithStuckThreshold,
	// plus the poll interval for an idle row.
	Still, Allowed time.Duration
}

// StatusStuck is Status with the checkpoint rows that Healthy would report
// stuck, taken from the same reads so that the two agree: one for an
// unpartitioned subscriber (Partition -1), any of the partitions of a
// partitioned one, by partition. By Healthy's rule no row is stuck while
// Run is not running in this process (State stopped) or the name is
// paused, and a halted row is not stuck but halted (Healthy reports
// ErrSubscriberHalted). Its cost and errors are Status's; safe for
// concurrent use, including while Run runs.
func (s *Subscriber) StatusStuck(ctx context.Context) (Status, []StuckCheckpoint, error) {
	st, progress, err := s.status(ctx)
	if st.State == StateStopped || st.Paused {
		return st, nil, err
	}
	rows := []PartitionStatus{{Partition: -1, State: st.State, Position: st.Position, Lag: st.Lag}}
	if st.Partitions != nil {
		rows = st.Partitions
	}
	if len(progress) != len(rows) {
		return st, nil, err // a read that failed: no rows to judge
	}
	var stuck []StuckCheckpoint
	for i, row := range rows {
		if row.State == StateStopped || row.State == StateHalted {
			continue
		}
		if still, allowed, ok := s.stuckFor(row, progress[i]); ok {
			stuck = append(stuck, StuckCheckpoint{Partition: row.Partition, Still: still, Allowed: allowed})
		}
	}
	return st, stuck, err
}
