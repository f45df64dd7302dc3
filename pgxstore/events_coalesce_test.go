package pgxstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// TestCoalescedAppendsShareOneTransaction queues appends behind a held
// one: those that wait together are sent in one transaction (their rows
// share one xmin), each keeps its own outcome (a stale version conflicts,
// a retry is recognised, a cancelled one leaves), and the feed stays in
// order.
func TestCoalescedAppendsShareOneTransaction(t *testing.T) {
	ctx := testCtx(t)
	store, pg := newEventStore(t)
	gate := pgfeed.NewGate(t, pg)
	observer := pgfeed.Connect(t, pg.DSN)
	key := pgfeed.AppendLockKey(t, observer)

	stored := feedtest.NewEvent("stored", "x", 1)
	require.NoError(t, store.Append(ctx, "stored", 0, stored))
	require.NoError(t, store.Append(ctx, "stale", 0, feedtest.NewEvent("stale", "x", 1)))

	held := feedtest.NewEvent("held", "x", nil)
	doneHeld := feedtest.Async(func() error { return store.Append(ctx, "held", 0, held) })
	gate.WaitHeld(t, 1)
	// The second in-flight transaction, queued on the lock in the database.
	second := feedtest.NewEvent("second", "x", nil)
	doneSecond := feedtest.Async(func() error { return store.Append(ctx, "second", 0, second) })
	pgfeed.WaitForLockWaiters(t, observer, key, 1, "the second append")

	// These wait in the coalescer, in one forming batch.
	const joiners = 6
	var (
		joined []domain.EventEnvelope[any]
		dones  []chan error
	)
	for i := range joiners {
		agg := fmt.Sprintf("joiner%d", i)
		evs := []domain.EventEnvelope[any]{feedtest.NewEvent(agg, "x", i), feedtest.NewEvent(agg, "x", i)}
		joined = append(joined, evs...)
		dones = append(dones, feedtest.Async(func() error { return store.Append(ctx, agg, 0, evs...) }))
	}
	conflict := feedtest.Async(func() error { return store.Append(ctx, "stale", 0, feedtest.NewEvent("stale", "x", 2)) })
	retry := feedtest.Async(func() error { return store.Append(ctx, "stored", 0, stored) })
	cancelCtx, cancel := context.WithCancel(ctx)
	leaver := feedtest.NewEvent("leaver", "x", nil)
	left := feedtest.Async(func() error { return store.Append(cancelCtx, "leaver", 0, leaver) })
	feedtest.Eventually(t, "the appends wait in one batch", func() bool { return pgxstore.FormingAppends(store) == joiners+3 })
	cancel()
	require.ErrorIs(t, feedtest.Result(t, left, "the cancelled append"), context.Canceled)
	require.Equal(t, joiners+2, pgxstore.FormingAppends(store), "the cancelled append left the batch")

	gate.Release()
	require.NoError(t, feedtest.Result(t, doneHeld, "the held append"))
	require.NoError(t, feedtest.Result(t, doneSecond, "the second append"))
	for i, done := range dones {
		require.NoError(t, feedtest.Result(t, done, fmt.Sprintf("joiner %d", i)))
	}
	require.ErrorIs(t, feedtest.Result(t, conflict, "the stale append"), domain.ErrConcurrencyConflict)
	require.ErrorIs(t, feedtest.Result(t, retry, "the retry"), domain.ErrAlreadyAppended)

	var xmins []string
	rows, err := observer.Query(ctx, "SELECT DISTINCT xmin::text FROM events WHERE aggregate_id LIKE 'joiner%'")
	require.NoError(t, err)
	for rows.Next() {
		var x string
		require.NoError(t, rows.Scan(&x))
		xmins = append(xmins, x)
	}
	require.NoError(t, rows.Err())
	require.Len(t, xmins, 1, "the joiners committed in one transaction")

	feed, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	feedtest.RequireStrictlyIncreasing(t, feed)
	require.Len(t, feed, 4+len(joined), "stored, stale, held, second and the joiners; not the leaver")
	require.Equal(t, []int64{1, 2, 3, 4}, feedtest.Positions(feed[:4]))
	require.ElementsMatch(t, feedtest.IDs(joined), feedtest.IDs(feed[4:]))
	_, err = store.GetEventByID(ctx, leaver.ID)
	require.ErrorIs(t, err, domain.ErrEventNotFound)
}

// TestUncoalescedAppends runs concurrent appends with coalescing off:
// each in its own transaction, all stored, in order.
func TestUncoalescedAppends(t *testing.T) {
	ctx := testCtx(t)
	store, _ := newEventStore(t)
	pgxstore.SetAppendCoalescing(store, false)
	var dones []chan error
	for w := range 8 {
		agg := fmt.Sprintf("solo%d", w)
		dones = append(dones, feedtest.Async(func() error {
			for i := range 5 {
				if err := store.Append(ctx, agg, i, feedtest.NewEvent(agg, "x", i)); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	for _, done := range dones {
		require.NoError(t, feedtest.Result(t, done, "a writer"))
	}
	feed, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, feed, 40)
	feedtest.RequireStrictlyIncreasing(t, feed)
}
