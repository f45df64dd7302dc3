package subscriptions_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// TestParkedEntryDoesNotOutliveRedelivery: a parked event delivered again
// after a checkpoint reset. Until the subscriber gets there the entry stays
// listed and ReplayParked refuses it (ErrParkedAfterCheckpoint: the event
// would be handled twice); a successful live delivery removes it with the
// batch, so the event is handled once and nothing is left to replay; a
// failing one parks it again, once, with the new error. Entries of other
// subscribers and before the reset position are untouched.
func TestParkedEntryDoesNotOutliveRedelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, fixedAfterReset := range []bool{true, false} {
				name := "park-redeliver-fixed"
				if !fixedAfterReset {
					name = "park-redeliver-still-failing"
				}
				t.Run(name, func(t *testing.T) {
					e := b.New(t)
					before, poison, after := parkFeed(t, e, 2, 2)
					var phase atomic.Int32 // 0: failing, 1: after the reset
					errAgain := errors.New("park: still refused after the reset")
					probe := newParkProbe()
					h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
						switch {
						case ev.ID != poison.ID:
							return nil
						case phase.Load() == 0:
							return errParkPoison
						case !fixedAfterReset:
							return errAgain
						}
						return nil
					})
					sub := parkSubscriber(t, e, name, h, subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
					r := start(t, sub)
					parkWaitParked(t, sub, 1)
					waitCaughtUp(t, sub)
					r.stop(t)

					// Entries the redelivery must leave alone: another
					// subscriber's entry for the same event, and this
					// subscriber's entry before the reset position.
					first, err := e.Events.GetEventByID(ctx, before[0])
					require.NoError(t, err)
					require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: name + "-other", EventID: poison.ID, Position: poison.Position, Error: "other", Attempts: 1}))
					require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: name, EventID: first.ID, Position: first.Position, Error: "kept", Attempts: 1}))

					// Rebuild from just after the first event.
					phase.Store(1)
					require.NoError(t, sub.ResetCheckpoint(ctx, first.Position))
					if e.DB != nil {
						require.NoError(t, e.DB.Exec("DELETE FROM "+parkProjection+" WHERE position > ?", first.Position).Error)
					}
					parked, err := sub.ListParked(ctx)
					require.NoError(t, err)
					require.Len(t, parked, 2, "listed until delivered again")
					err = sub.ReplayParked(ctx, poison.ID)
					require.ErrorIs(t, err, subscriptions.ErrParkedAfterCheckpoint)
					require.ErrorIs(t, sub.ReplayParked(ctx, after[0]), subscriptions.ErrEventNotParked, "not parked at all")
					require.Zero(t, probe.handledCount(poison.ID), "the refused replay ran nothing")

					r = start(t, sub)
					waitCaughtUp(t, sub)
					r.stop(t)

					parked, err = sub.ListParked(ctx)
					require.NoError(t, err)
					if fixedAfterReset {
						require.Len(t, parked, 1)
						require.Equal(t, first.ID, parked[0].EventID, "the entry before the reset position stays")
						require.ErrorIs(t, sub.ReplayParked(ctx, poison.ID), subscriptions.ErrEventNotParked)
						require.Equal(t, 1, probe.handledCount(poison.ID), "handled once, live")
						parkRequireProcessed(t, e, probe, parkConcat(before, []string{poison.ID}, after))
					} else {
						require.Len(t, parked, 2)
						require.Equal(t, poison.ID, parked[1].EventID)
						require.Contains(t, parked[1].Error, errAgain.Error(), "parked again with the new error")
						require.Zero(t, probe.handledCount(poison.ID))
						parkRequireProcessed(t, e, probe, parkConcat(before, after))
					}
					other, err := e.Parking.List(ctx, name+"-other")
					require.NoError(t, err)
					require.Len(t, other, 1, "another subscriber's entry is untouched")
				})
			}
		})
	}
}

// TestParkedEntryRemovalCommitsWithTheBatch: on the database backends the
// removal of a redelivered event's parked entry is part of the batch: while
// the batch's commit fails, the entry stays; once a commit succeeds, it is
// gone.
func TestParkedEntryRemovalCommitsWithTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			const name = "park-removal-atomic"
			ids := appendN(t, e.Events, "park.atomic", 0, 3)
			ev, err := e.Events.GetEventByID(ctx, ids[1])
			require.NoError(t, err)
			require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: name, EventID: ev.ID, Position: ev.Position, Error: "old", Attempts: 1}))
			flaky := &faultFlakyCommits{CheckpointStore: e.Checkpoints, at: ev.Position, fail: 1 << 30}
			sub, err := subscriptions.NewSubscriber(name, e.Events, flaky, func(context.Context, domain.EventEnvelope[any]) error { return nil },
				subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithParkingLot(e.Parking))
			require.NoError(t, err)
			r := start(t, sub)
			require.Eventually(t, func() bool {
				flaky.mu.Lock()
				defer flaky.mu.Unlock()
				return flaky.failed >= 2
			}, 30*time.Second, 2*time.Millisecond, "no commit was attempted")
			parked, err := e.Parking.List(ctx, name)
			require.NoError(t, err)
			require.Len(t, parked, 1, "a failed commit keeps the entry")
			flaky.setFail(0)
			waitCaughtUp(t, sub)
			r.stop(t)
			parked, err = e.Parking.List(ctx, name)
			require.NoError(t, err)
			require.Empty(t, parked, "the committed delivery removed the entry")
		})
	}
}
