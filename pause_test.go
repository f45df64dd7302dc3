package subscriptions_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// pauseCounter counts each event's handler calls.
type pauseCounter struct {
	mu    sync.Mutex
	calls map[string]int
	total atomic.Int64
}

func (c *pauseCounter) handler(ctx context.Context, ev domain.EventEnvelope[any]) error {
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[ev.ID]++
	c.mu.Unlock()
	c.total.Add(1)
	return nil
}

func (c *pauseCounter) requireOnce(t *testing.T, events []domain.EventEnvelope[any]) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range events {
		require.Equal(t, 1, c.calls[ev.ID], "event %s at %d", ev.ID, ev.Position)
	}
}

// TestPauseEverywhere: Pause stops a name in every replica and partition,
// with a per-event or a batch handler (two replicas, on Postgres in
// separate pools as separate processes have): after it returns no
// handler runs and no checkpoint moves while events are appended, a
// Subscriber of the name started afterwards (a restart) stays paused,
// Status reports the pause and Healthy does not take the lag for a stuck
// subscriber (each replica's Status has the reason); Resume lets them go
// on, and every event is handled exactly once.
func TestPauseEverywhere(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		for _, v := range []struct {
			name  string
			parts int
			batch bool
		}{{"", 0, false}, {"/partitioned", 4, false}, {"/partitioned/batch-handler", 4, true}} {
			t.Run(b.Name+v.name, func(t *testing.T) {
				t.Parallel()
				e := b.New(t)
				ctx := context.Background()
				counter := &pauseCounter{}
				opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(5 * time.Millisecond),
					subscriptions.WithStuckThreshold(20 * time.Millisecond), subscriptions.WithLogger(quietLogger())}
				if v.parts > 0 {
					opts = append(opts, subscriptions.WithPartitions(v.parts), subscriptions.WithConcurrency(2))
				}
				handler := subscriptions.Handler(counter.handler)
				if v.batch {
					handler = nil
					opts = append(opts, subscriptions.WithBatchHandler(func(ctx context.Context, events []domain.EventEnvelope[any]) error {
						for _, ev := range events {
							if err := counter.handler(ctx, ev); err != nil {
								return err
							}
						}
						return nil
					}))
				}
				var subs []*subscriptions.Subscriber
				for range 2 {
					events, cps, _ := partReplica(t, e)
					sub, err := subscriptions.NewSubscriber("pause-me", events, cps, handler, opts...)
					require.NoError(t, err)
					subs = append(subs, sub)
					start(t, sub)
				}
				seq := map[string]int{}
				all := partAppend(t, e.Events, seq, 16, 30)
				waitCaughtUp(t, subs[0])

				require.NoError(t, subs[0].Pause(ctx, "a bad deploy"))
				before := counter.total.Load()
				positions := pausePositions(t, subs[0])
				all = append(all, partAppend(t, e.Events, seq, 16, 30)...)
				// A later Subscriber of the name (a restart) is paused too.
				late, err := subscriptions.NewSubscriber("pause-me", e.Events, e.Checkpoints, handler, opts...)
				require.NoError(t, err)
				lateRun := start(t, late)
				require.Never(t, func() bool { return counter.total.Load() != before }, 300*time.Millisecond, 5*time.Millisecond,
					"a handler ran while the name was paused")
				require.Equal(t, positions, pausePositions(t, subs[0]), "a checkpoint moved while paused")
				for _, sub := range append(subs, late) {
					st, err := sub.Status(ctx)
					require.NoError(t, err)
					require.True(t, st.Paused)
					require.False(t, st.PausedAt.IsZero())
					require.Equal(t, "a bad deploy", st.PauseReason, "every replica reads the reason")
					require.Positive(t, st.Lag)
					require.NoError(t, sub.Healthy(ctx), "a paused subscriber is not stuck")
				}

				require.NoError(t, late.Resume(ctx))
				for _, sub := range subs {
					waitCaughtUp(t, sub)
				}
				lateRun.stop(t)
				counter.requireOnce(t, all)
				st, err := subs[1].Status(ctx)
				require.NoError(t, err)
				require.False(t, st.Paused)
			})
		}
	}
}

// pausePositions reads the checkpoint (or every partition's) of sub.
func pausePositions(t *testing.T, sub *subscriptions.Subscriber) []int64 {
	t.Helper()
	st, err := sub.Status(context.Background())
	require.NoError(t, err)
	if st.Partitions == nil {
		return []int64{st.Position}
	}
	out := make([]int64, len(st.Partitions))
	for i, p := range st.Partitions {
		out[i] = p.Position
	}
	return out
}

// TestPauseBatchInFlight: a batch whose handler runs when Pause is called
// commits or rolls back as usual, and Pause returns only once it has
// ended (on SQLite the store's fence rolls it back at once): after
// Pause returned, the checkpoint never moves, even when the blocked
// handler is released afterwards.
func TestPauseBatchInFlight(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			ctx := context.Background()
			gate := newCoreGate()
			defer gate.open()
			sub, err := subscriptions.NewSubscriber("pause-inflight", e.Events, e.Checkpoints, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				gate.pass()
				return nil
			}, subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			start(t, sub)
			// One append: on in-memory SQLite the blocked batch holds the one
			// connection until Pause's fence ends it.
			appendN(t, e.Events, "pause.inflight", 0, 1)
			gate.waitEntered(t)
			paused := make(chan error, 1)
			go func() { paused <- sub.Pause(ctx, "") }()
			var pauseErr error
			select {
			case pauseErr = <-paused:
			case <-time.After(200 * time.Millisecond):
				// Postgres and memory wait for the batch: release it.
				gate.open()
				pauseErr = <-paused
			}
			require.NoError(t, pauseErr)
			gate.open()
			at, err := e.Checkpoints.Position(ctx, "pause-inflight")
			require.NoError(t, err)
			appendN(t, e.Events, "pause.inflight", 3, 3)
			require.Never(t, func() bool {
				p, err := e.Checkpoints.Position(ctx, "pause-inflight")
				return err != nil || p != at
			}, 200*time.Millisecond, 5*time.Millisecond, "the checkpoint moved after Pause returned")
			require.NoError(t, sub.Resume(ctx))
			waitCaughtUp(t, sub)
		})
	}
}

// TestPauseCancelledWhileWaiting: a Pause whose context ends while it
// waits for the batch in flight fails, and its error says that the pause
// is recorded all the same (Resume lifts it), as Status shows; on
// Postgres the batch in flight does not commit after it; Resume lets the
// name go on. Memory and Postgres (on SQLite Pause ends the batch in
// flight instead of waiting for it).
func TestPauseCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		if b.Name != "memory" && !b.Postgres {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			ctx := context.Background()
			gate := newCoreGate()
			defer gate.open()
			sub, err := subscriptions.NewSubscriber("pause-cancelled", e.Events, e.Checkpoints, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				gate.pass()
				return nil
			}, subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			start(t, sub)
			appendN(t, e.Events, "pause.cancelled", 0, 1)
			gate.waitEntered(t)

			pctx, cancel := context.WithCancel(ctx)
			defer cancel()
			paused := make(chan error, 1)
			go func() { paused <- sub.Pause(pctx, "cancelled") }()
			// Cancelled once it waits for the batch (pgxstore sends one
			// cancel request, which a statement not yet sent would miss).
			require.Eventually(t, func() bool {
				if e.Postgres() {
					return coreLockWaiters(t, e.PG) > 0
				}
				return coreGoroutineBlockedIn("(*MemoryCheckpointStore).fenced")
			}, 30*time.Second, 2*time.Millisecond, "Pause never waited for the batch in flight")
			cancel()
			select {
			case err = <-paused:
			case <-time.After(30 * time.Second):
				t.Fatal("Pause did not return within 30 s of its cancellation")
			}
			require.Error(t, err, "Pause did not wait for the batch in flight")
			require.ErrorContains(t, err, "recorded")
			require.ErrorContains(t, err, "Resume lifts")
			st, err := sub.Status(ctx)
			require.NoError(t, err)
			require.True(t, st.Paused)
			require.Equal(t, "cancelled", st.PauseReason)

			gate.open()
			if b.Postgres {
				// Its commit checks the pause (in memory the batch the
				// cancelled Pause waited for commits, as it would have
				// before a Pause that returned).
				require.Never(t, func() bool {
					p, err := e.Checkpoints.Position(ctx, "pause-cancelled")
					return err != nil || p != 0
				}, 200*time.Millisecond, 5*time.Millisecond, "the batch in flight committed while paused")
			}
			require.NoError(t, sub.Resume(ctx))
			waitCaughtUp(t, sub)
		})
	}
}
