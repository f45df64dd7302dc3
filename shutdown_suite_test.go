package subscriptions_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// TestHandlerTimeoutSuite: a handler that hangs until its context ends is
// cut off by WithHandlerTimeout: a hang once is retried and succeeds, a
// hang every time is parked with ErrHandlerTimeout, on every backend.
func TestHandlerTimeoutSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ids := appendN(t, e.Events, "timeout.event", 0, 8)
			proj := newCountProjection(t, e)
			var hungOnce atomic.Bool
			var causesMu sync.Mutex
			var causes []error
			hang := func(ctx context.Context) error {
				<-ctx.Done()
				causesMu.Lock()
				causes = append(causes, context.Cause(ctx))
				causesMu.Unlock()
				return ctx.Err()
			}
			handler := func(ctx context.Context, ev coreEnvelope) error {
				switch {
				case ev.ID == ids[2] && hungOnce.CompareAndSwap(false, true):
					return hang(ctx) // a call that hangs once
				case ev.ID == ids[5]:
					return hang(ctx) // a call that always hangs
				}
				return proj.apply(ctx, ev)
			}
			sub := coreNewSub(t, "timeout", e.Events, e.Checkpoints, handler,
				subscriptions.WithHandlerTimeout(30*time.Millisecond),
				subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(1),
				subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond))
			run := start(t, sub)
			_, err := sub.WaitCaughtUp(ctx)
			require.NoError(t, err)
			run.stop(t)

			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, ids[5], parked[0].EventID)
			require.Equal(t, 2, parked[0].Attempts)
			require.Contains(t, parked[0].Error, subscriptions.ErrHandlerTimeout.Error())
			require.Contains(t, parked[0].Error, context.DeadlineExceeded.Error())

			want := onceEach(ids)
			delete(want, ids[5])
			proj.requireOnce(t, want)
			causesMu.Lock()
			defer causesMu.Unlock()
			require.Len(t, causes, 3) // ids[2] once, ids[5] twice
			for _, c := range causes {
				require.ErrorIs(t, c, subscriptions.ErrHandlerTimeout)
			}
		})
	}
}

// TestShutdownGraceSuite: with WithShutdownGrace, a handler still running
// after Run's cancellation has its context cancelled, its batch rolls back
// and Run returns; the batch is delivered again after a restart. Without
// it, the batch in flight drains (the default), on every backend.
func TestShutdownGraceSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			// The hung handler either honours its context (returns its
			// error) or swallows the cancellation and returns nil; either
			// way the batch must roll back. The nil case hangs on the
			// batch's last event, so that no later handler can fail on the
			// cancelled context and hide a commit.
			for _, tc := range []struct {
				name    string
				hung    int // index of the event whose handler hangs (batch 5..9)
				returns func(ctx context.Context) error
			}{
				{"handler returns its context's error", 6, func(ctx context.Context) error { return ctx.Err() }},
				{"handler returns nil after the cancellation", 9, func(context.Context) error { return nil }},
			} {
				t.Run("grace expires, "+tc.name+": the batch rolls back and is redelivered", func(t *testing.T) {
					e := b.New(t)
					ids := appendN(t, e.Events, "grace.event", 0, 10)
					proj := newCountProjection(t, e)
					gate := newCoreGate()
					var hang atomic.Bool
					hang.Store(true)
					cause := make(chan error, 1)
					handler := func(ctx context.Context, ev coreEnvelope) error {
						if err := proj.apply(ctx, ev); err != nil {
							return err
						}
						if ev.ID == ids[tc.hung] && hang.Load() {
							select {
							case gate.entered <- struct{}{}:
							default:
							}
							<-ctx.Done() // a hung call that notices its context
							cause <- context.Cause(ctx)
							return tc.returns(ctx)
						}
						return nil
					}
					logger, logs := newLogger()
					sub := coreNewSub(t, "grace", e.Events, e.Checkpoints, handler, subscriptions.WithBatchSize(5),
						subscriptions.WithShutdownGrace(20*time.Millisecond), subscriptions.WithLogger(logger),
						subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
					run := start(t, sub)
					gate.waitEntered(t) // the batch of events 5..9 is in flight
					run.stop(t)         // returns although the handler never would
					require.ErrorIs(t, <-cause, subscriptions.ErrShutdownGrace)
					require.Contains(t, logs.String(), "shutdown grace period expired")

					p, err := e.Checkpoints.Position(ctx, sub.Name())
					require.NoError(t, err)
					feed := coreFeed(t, e.Events)
					require.Equal(t, feed[4].Position, p, "the batch in flight rolled back")
					parked, err := sub.ListParked(ctx)
					require.NoError(t, err)
					require.Empty(t, parked, "an event cut off by shutdown is not parked")

					hang.Store(false)
					run = start(t, sub)
					_, err = sub.WaitCaughtUp(ctx)
					require.NoError(t, err)
					run.stop(t)
					counts := proj.counts(t)
					if e.DB == nil {
						// Memory has no transaction: the rolled-back batch's
						// events up to the hung one were applied before the cut.
						for _, id := range ids[5 : tc.hung+1] {
							require.Equal(t, 2, counts[id])
							counts[id] = 1
						}
					}
					require.Equal(t, onceEach(ids), counts, "redelivered after the restart")
				})
			}

			// The batch in flight commits when its handler finishes after
			// the cancellation: within a grace (one no test machine
			// exhausts; the handler is released right after the
			// cancellation), or with no grace at all, by default.
			for _, tc := range []struct {
				name, sub, eventType string
				opts                 []subscriptions.SubscriberOption
				ctxMsg               string
			}{
				{"a handler finishing within the grace commits its batch", "within", "within.event",
					[]subscriptions.SubscriberOption{subscriptions.WithShutdownGrace(time.Hour)},
					"the handler's context is not cancelled within the grace"},
				{"no grace: the batch in flight drains", "drain", "drain.event", nil,
					"the handler's context is not cancelled by default"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					e := b.New(t)
					ids := appendN(t, e.Events, tc.eventType, 0, 10)
					proj := newCountProjection(t, e)
					gate := newCoreGate()
					defer gate.open()
					ctxErr := make(chan error, 1)
					handler := func(ctx context.Context, ev coreEnvelope) error {
						if ev.ID == ids[6] {
							gate.pass()
							ctxErr <- ctx.Err()
						}
						return proj.apply(ctx, ev)
					}
					opts := append([]subscriptions.SubscriberOption{subscriptions.WithBatchSize(5)}, tc.opts...)
					sub := coreNewSub(t, tc.sub, e.Events, e.Checkpoints, handler, opts...)
					run := start(t, sub)
					gate.waitEntered(t)
					run.cancel()
					gate.open()
					require.NoError(t, <-ctxErr, tc.ctxMsg)
					run.stop(t)
					p, err := e.Checkpoints.Position(ctx, sub.Name())
					require.NoError(t, err)
					feed := coreFeed(t, e.Events)
					require.Equal(t, feed[9].Position, p, "the batch in flight committed")
					require.Equal(t, onceEach(ids), proj.counts(t))
				})
			}
		})
	}
}
