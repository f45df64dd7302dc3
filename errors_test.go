package subscriptions_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// TestErrorsSayTheirContextOnce: the callee adds context, the caller does
// not repeat it. Each error names the subscriber and carries the package
// prefix exactly once, and still wraps the sentinel callers branch on.
func TestErrorsSayTheirContextOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := infrastructure.NewMemoryStore()
	checkpoints := subscriptions.NewMemoryCheckpointStore()
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	plain, err := subscriptions.NewSubscriber("s", events, checkpoints, noop)
	require.NoError(t, err)
	parked, err := subscriptions.NewSubscriber("p", events, checkpoints, noop,
		subscriptions.WithParkingLot(subscriptions.NewMemoryParkingLot()))
	require.NoError(t, err)
	appendN(t, events, "t.e", 1, 1)

	batch, ok, err := checkpoints.Acquire(ctx, "s")
	require.NoError(t, err)
	require.True(t, ok)
	defer func() { require.NoError(t, batch.Rollback()) }()

	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		names    string
	}{
		{"reset during a batch", plain.ResetCheckpoint(ctx, 3), subscriptions.ErrBatchInFlight, `"s"`},
		{"list without a lot", func() error { _, err := plain.ListParked(ctx); return err }(), subscriptions.ErrNoParkingLot, `"s"`},
		{"replay of an event that is not parked", parked.ReplayParked(ctx, coreFeed(t, events)[0].ID), subscriptions.ErrEventNotParked, `"p"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.err, tc.sentinel)
			msg := tc.err.Error()
			require.Equal(t, 1, strings.Count(msg, "subscriptions:"), "prefix repeated: %s", msg)
			require.Equal(t, 1, strings.Count(msg, tc.names), "subscriber named once: %s", msg)
		})
	}
}
