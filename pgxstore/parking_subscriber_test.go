package pgxstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// TestSubscriberWithThePgxLot: a subscriber (GORM event and checkpoint
// stores) parks a poison event in the pgx lot, counts it in Status, gets,
// pages, replays and, after a checkpoint reset, clears a redelivered entry
// through the lot's capabilities; DeleteState purges it.
func TestSubscriberWithThePgxLot(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	lot, pg, _ := newLot(t)
	store, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(pg.DB)
	require.NoError(t, err)
	var evs []domain.EventEnvelope[any]
	for i := 1; i <= 3; i++ {
		evs = append(evs, domain.NewEventEnvelope[any](map[string]any{"n": i}, "agg-e2e", "e2e.happened", i))
	}
	require.NoError(t, store.Append(ctx, "agg-e2e", 0, evs...))
	feed, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, feed, 3)
	poison := feed[1]

	var mu sync.Mutex
	broken := true
	var handled []string
	handler := func(_ context.Context, ev domain.EventEnvelope[any]) error {
		mu.Lock()
		defer mu.Unlock()
		if ev.ID == poison.ID && broken {
			return errors.New("poison")
		}
		handled = append(handled, ev.ID)
		return nil
	}
	sub, err := subscriptions.NewSubscriber("e2e", store, cps, handler, subscriptions.WithParkingLot(lot),
		subscriptions.WithMaxRetries(0), subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)

	run := func(t *testing.T) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- sub.Run(rctx) }()
		_, err := sub.WaitCaughtUp(ctx)
		cancel()
		require.NoError(t, err)
		require.NoError(t, <-done)
	}
	run(t)
	st, err := sub.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Parked)
	got, err := sub.GetParked(ctx, poison.ID)
	require.NoError(t, err)
	require.Equal(t, poison.Position, got.Position)
	require.Equal(t, "agg-e2e", got.AggregateID)
	page, err := sub.ListParkedPage(ctx, subscriptions.ParkedFilter{AggregateID: "agg-e2e"})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)

	mu.Lock()
	broken = false
	mu.Unlock()
	require.NoError(t, sub.ReplayParked(ctx, poison.ID))
	parked, err := sub.ListParked(ctx)
	require.NoError(t, err)
	require.Empty(t, parked)

	// Parked again, then delivered again after a reset: the live delivery
	// clears the entry (DeliveredClearer, after the GORM batch commits).
	require.NoError(t, lot.Park(ctx, got))
	require.NoError(t, sub.ResetCheckpoint(ctx, 0))
	run(t)
	parked, err = sub.ListParked(ctx)
	require.NoError(t, err)
	require.Empty(t, parked, "the redelivered event's entry is cleared")

	require.NoError(t, lot.Park(ctx, got))
	require.NoError(t, sub.DeleteState(ctx))
	n, err := lot.CountParked(ctx, "e2e")
	require.NoError(t, err)
	require.Zero(t, n, "DeleteState purges the lot")
	mu.Lock()
	defer mu.Unlock()
	// A batch's failed attempt is handled again (its writes rolled back),
	// so only the end is exact: the replay, then the redelivery.
	require.GreaterOrEqual(t, len(handled), 4)
	require.Equal(t, []string{poison.ID, feed[0].ID, feed[1].ID, feed[2].ID}, handled[len(handled)-4:])
}
