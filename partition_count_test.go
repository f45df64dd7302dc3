package subscriptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// TestPartitionCountCheckedByEveryCall: a name whose checkpoints were
// written for 4 partitions is refused with ErrPartitionsChanged, before
// anything changes and before the application's cleanup runs, by every
// call of a Subscriber built with another count (8) or none: Run,
// ResetCheckpoint, ResetCheckpointWith, DeleteState, WaitCaughtUp, Lag,
// PartitionLags and Status. The real checkpoints stay where they were, no
// row for another count appears, and the Subscriber with the recorded
// count then resets all four as usual.
func TestPartitionCountCheckedByEveryCall(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "count-acct"
			noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
			opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(5 * time.Millisecond), subscriptions.WithLogger(quietLogger())}
			if e.Parking != nil {
				opts = append(opts, subscriptions.WithParkingLot(e.Parking))
			}
			real, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, noop, append(opts, subscriptions.WithPartitions(4))...)
			require.NoError(t, err)
			partAppend(t, e.Events, map[string]int{}, 40, 80)
			run := start(t, real)
			waitCaughtUp(t, real)
			run.stop(t)
			positions := func(n int) []int64 {
				out := make([]int64, n)
				for p := range out {
					pos, err := e.Checkpoints.Position(ctx, fmt.Sprintf("%s/partition-%d-of-%d", name, p, n))
					require.NoError(t, err)
					out[p] = pos
				}
				return out
			}
			before := positions(4)
			for _, p := range before {
				require.Positive(t, p)
			}

			for _, tc := range []struct {
				what string
				opts []subscriptions.SubscriberOption
			}{
				{"WithPartitions(8)", []subscriptions.SubscriberOption{subscriptions.WithPartitions(8)}},
				{"unpartitioned", nil},
			} {
				t.Run(tc.what, func(t *testing.T) {
					other, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, noop, append(opts, tc.opts...)...)
					require.NoError(t, err)
					cleaned := false
					cleanup := func(context.Context) error { cleaned = true; return nil }
					calls := map[string]error{
						"ResetCheckpoint":     other.ResetCheckpoint(ctx, 0),
						"ResetCheckpointWith": other.ResetCheckpointWith(ctx, 0, cleanup),
						"DeleteState":         other.DeleteState(ctx),
					}
					_, calls["WaitCaughtUp"] = other.WaitCaughtUp(ctx)
					_, calls["Lag"] = other.Lag(ctx)
					_, calls["Status"] = other.Status(ctx)
					calls["Healthy"] = other.Healthy(ctx)
					if len(tc.opts) > 0 {
						_, calls["PartitionLags"] = other.PartitionLags(ctx)
					}
					runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
					calls["Run"] = other.Run(runCtx)
					cancel()
					for call, err := range calls {
						require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged, call)
						require.ErrorContains(t, err, "has checkpoints for 4 partitions", call)
					}
					require.False(t, cleaned, "the application's cleanup ran")
					require.Equal(t, before, positions(4), "the real checkpoints moved")
					require.Equal(t, make([]int64, 8), positions(8), "rows for another count appeared")
				})
			}

			cleaned := false
			require.NoError(t, real.ResetCheckpointWith(ctx, 0, func(context.Context) error { cleaned = true; return nil }))
			require.True(t, cleaned)
			require.Equal(t, make([]int64, 4), positions(4))
		})
	}
}

// TestReservedSubscriberNames: a name that ends like a partitioned
// subscriber's own checkpoint rows is refused, saying why; names that
// merely resemble them are not.
func TestReservedSubscriberNames(t *testing.T) {
	t.Parallel()
	events, cps := infrastructure.NewMemoryStore(), subscriptions.NewMemoryCheckpointStore()
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	for _, name := range []string{"acct/partitions", "acct/partition-0-of-4", "a/b/partition-12-of-16"} {
		_, err := subscriptions.NewSubscriber(name, events, cps, noop)
		require.ErrorContains(t, err, "reserved", name)
		require.ErrorContains(t, err, name, "the error names the name")
	}
	for _, name := range []string{"acct/partitions-old", "acct/partition", "partitions", "acct/partition-x-of-4"} {
		_, err := subscriptions.NewSubscriber(name, events, cps, noop)
		require.NoError(t, err, name)
	}
}

// plainCheckpointStore is a checkpoint store with none of the optional
// capabilities: a store of one's own that implements only the interface.
type plainCheckpointStore struct{ subscriptions.CheckpointStore }

// TestPartitionCountCheckedWithoutPartitionStore: on a checkpoint store
// without PartitionCheckpointStore, ResetCheckpoint of a Subscriber built
// with another partition count is refused with ErrPartitionsChanged (the
// count checked before the resets, as the capability's documentation
// says), and the recorded partitions' checkpoints stay.
func TestPartitionCountCheckedWithoutPartitionStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := infrastructure.NewMemoryStore()
	checkpoints := plainCheckpointStore{subscriptions.NewMemoryCheckpointStore()}
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(5 * time.Millisecond), subscriptions.WithLogger(quietLogger())}
	real, err := subscriptions.NewSubscriber("plain-count", events, checkpoints, noop, append(opts, subscriptions.WithPartitions(4))...)
	require.NoError(t, err)
	partAppend(t, events, map[string]int{}, 40, 80)
	run := start(t, real)
	waitCaughtUp(t, real)
	run.stop(t)
	positions := func() []int64 {
		out := make([]int64, 4)
		for p := range out {
			pos, err := checkpoints.Position(ctx, fmt.Sprintf("plain-count/partition-%d-of-4", p))
			require.NoError(t, err)
			out[p] = pos
		}
		return out
	}
	before := positions()
	other, err := subscriptions.NewSubscriber("plain-count", events, checkpoints, noop, append(opts, subscriptions.WithPartitions(8))...)
	require.NoError(t, err)
	require.ErrorIs(t, other.ResetCheckpoint(ctx, 0), subscriptions.ErrPartitionsChanged)
	require.Equal(t, before, positions())
	require.NoError(t, real.ResetCheckpoint(ctx, 0), "the recorded count resets as usual")
	require.Equal(t, []int64{0, 0, 0, 0}, positions())
}
