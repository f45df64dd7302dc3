package subscriptions_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// statusAppendAged appends one event of type typ created age ago.
func statusAppendAged(t *testing.T, store domain.EventStore, typ string, age time.Duration) domain.EventEnvelope[any] {
	t.Helper()
	ev := domain.NewEventEnvelope[any](map[string]any{"t": typ}, "status-agg", typ, 0)
	ev.Created = time.Now().Add(-age)
	require.NoError(t, store.Append(context.Background(), ev.AggregateID, -1, ev))
	return ev
}

// statusWait waits until the subscriber's Status satisfies ok.
func statusWait(t *testing.T, sub *subscriptions.Subscriber, what string, ok func(subscriptions.Status) bool) subscriptions.Status {
	t.Helper()
	var st subscriptions.Status
	var err error
	require.Eventually(t, func() bool {
		st, err = sub.Status(context.Background())
		return err == nil && ok(st)
	}, 30*time.Second, 2*time.Millisecond, "%s; last status %+v, error %v", what, st, err)
	return st
}

// statusHealthyFor checks Healthy again and again until d has passed: a
// wait on the clock, not a bound on it.
func statusHealthyFor(t *testing.T, sub *subscriptions.Subscriber, d time.Duration) {
	t.Helper()
	for from := time.Now(); time.Since(from) <= d; {
		require.NoError(t, sub.Healthy(context.Background()))
		time.Sleep(2 * time.Millisecond)
	}
}

// TestStatusAndHealthyStates drives a subscriber through every state on
// every backend and checks Status and Healthy in each.
func TestStatusAndHealthyStates(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()

			t.Run("stopped, then idle, then stopped", func(t *testing.T) {
				e := b.New(t)
				sub := coreNewSub(t, "status-idle", e.Events, e.Checkpoints, coreNoop, subscriptions.WithPollInterval(5*time.Millisecond))
				st, err := sub.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, subscriptions.StateStopped, st.State)
				require.Equal(t, -1, st.Parked, "no parking lot")
				require.ErrorIs(t, sub.Healthy(ctx), subscriptions.ErrSubscriberStopped)

				appendN(t, e.Events, "status.ok", 0, 3)
				run := start(t, sub)
				st = statusWait(t, sub, "idle and caught up", func(st subscriptions.Status) bool {
					return st.State == subscriptions.StateIdle && st.Lag == 0
				})
				require.EqualValues(t, 3, st.Head)
				require.EqualValues(t, 3, st.Position)
				require.Zero(t, st.LagSeconds)
				require.False(t, st.LastCommitAt.IsZero())
				require.Empty(t, st.LastError)
				require.NoError(t, sub.Healthy(ctx))

				// Status is served as JSON as it is.
				raw, err := json.Marshal(st)
				require.NoError(t, err)
				var back map[string]any
				require.NoError(t, json.Unmarshal(raw, &back))
				require.Equal(t, "idle", back["state"])
				require.EqualValues(t, 3, back["position"])
				require.NotContains(t, back, "last_error_at", "zero times are omitted")

				run.stop(t)
				st, err = sub.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, subscriptions.StateStopped, st.State)
			})

			t.Run("running with a stalled handler: lag in time, stuck", func(t *testing.T) {
				if b.Name == "sqlite-memory" {
					t.Skip("one connection: Status waits for the stalled batch to release it (documented)")
				}
				e := b.New(t)
				gate := newCoreGate()
				handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					gate.pass()
					return nil
				}
				sub := coreNewSub(t, "status-stalled", e.Events, e.Checkpoints, handler,
					subscriptions.WithStuckThreshold(50*time.Millisecond))
				statusAppendAged(t, e.Events, "status.old", time.Hour)
				run := start(t, sub)
				defer run.stop(t)
				defer gate.open()
				gate.waitEntered(t)

				st, err := sub.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, subscriptions.StateRunning, st.State)
				require.EqualValues(t, 1, st.Lag)
				require.GreaterOrEqual(t, st.LagSeconds, time.Hour.Seconds())
				require.Less(t, st.LagSeconds, 2*time.Hour.Seconds())
				// Stuck once the threshold has passed without progress.
				require.Eventually(t, func() bool {
					return errors.Is(sub.Healthy(ctx), subscriptions.ErrSubscriberStuck)
				}, 30*time.Second, 5*time.Millisecond)

				gate.open()
				statusWait(t, sub, "caught up after the stall", func(st subscriptions.Status) bool { return st.Lag == 0 })
				require.NoError(t, sub.Healthy(ctx))
			})

			t.Run("lag too old", func(t *testing.T) {
				if b.Name == "sqlite-memory" {
					t.Skip("one connection: Status waits for the stalled batch to release it (documented)")
				}
				e := b.New(t)
				gate := newCoreGate()
				handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					gate.pass()
					return nil
				}
				sub := coreNewSub(t, "status-old", e.Events, e.Checkpoints, handler, subscriptions.WithMaxLagTime(time.Minute))
				statusAppendAged(t, e.Events, "status.old", time.Hour)
				run := start(t, sub)
				defer run.stop(t)
				defer gate.open()
				gate.waitEntered(t)
				require.ErrorIs(t, sub.Healthy(ctx), subscriptions.ErrLagTooOld)
			})

			t.Run("retrying, then parked", func(t *testing.T) {
				e := b.New(t)
				bad := statusAppendAged(t, e.Events, "status.bad", 0)
				failing := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					return errors.New("refused")
				}
				// A backoff far longer than the test: the subscriber stays in
				// the retrying state until it is stopped.
				sub := coreNewSub(t, "status-retry", e.Events, e.Checkpoints, failing,
					subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(3),
					subscriptions.WithRetryBackoff(time.Hour, time.Hour))
				run := start(t, sub)
				st := statusWait(t, sub, "retrying", func(st subscriptions.Status) bool { return st.State == subscriptions.StateRetrying })
				require.Equal(t, &subscriptions.EventRef{ID: bad.ID, Type: "status.bad", Position: st.Failing.Position}, st.Failing)
				require.Equal(t, 1, st.Attempts)
				require.Equal(t, "refused", st.LastError)
				require.False(t, st.LastErrorAt.IsZero())
				require.Equal(t, bad.ID, st.LastErrorEvent.ID)
				require.Zero(t, st.Parked)
				require.NoError(t, sub.Healthy(ctx), "retrying is healthy until the stuck threshold")
				// The snapshot is the caller's: changing it changes nothing else.
				st.Failing.ID, st.LastErrorEvent.ID = "changed", "changed"
				again, err := sub.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, bad.ID, again.Failing.ID)
				require.Equal(t, bad.ID, again.LastErrorEvent.ID)
				run.stop(t)

				// Parking clears the failure; the last error stays.
				sub = coreNewSub(t, "status-retry", e.Events, e.Checkpoints, failing,
					subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
				start(t, sub)
				st = statusWait(t, sub, "parked", func(st subscriptions.Status) bool { return st.Parked == 1 && st.Lag == 0 })
				require.Nil(t, st.Failing)
				require.Equal(t, "refused", st.LastError)
				require.NoError(t, sub.Healthy(ctx))
			})

			t.Run("halted without a parking lot", func(t *testing.T) {
				e := b.New(t)
				bad := statusAppendAged(t, e.Events, "status.bad", 0)
				failing := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					return errors.New("refused")
				}
				kit := newTelemetryKit(t)
				sub := coreNewSub(t, "status-halt", e.Events, e.Checkpoints, failing,
					append(kit.options(), subscriptions.WithPollInterval(5*time.Millisecond))...)
				start(t, sub)
				st := statusWait(t, sub, "halted, attempted twice", func(st subscriptions.Status) bool {
					return st.State == subscriptions.StateHalted && st.Attempts >= 2
				})
				require.Equal(t, bad.ID, st.Failing.ID)
				require.EqualValues(t, 1, st.Lag)
				err := sub.Healthy(ctx)
				require.ErrorIs(t, err, subscriptions.ErrSubscriberHalted)
				require.ErrorContains(t, err, bad.ID)
				ms := kit.collect(t)
				require.GreaterOrEqual(t, telemetryCount(t, ms, "status-halt", subscriptions.OutcomeFailed), int64(2))
				require.Zero(t, telemetryCount(t, ms, "status-halt", subscriptions.OutcomeHandled))
			})

			t.Run("a batch after idle is running; the stuck clock starts at the append", func(t *testing.T) {
				if b.Name == "sqlite-memory" {
					t.Skip("one connection: Status waits for the stalled batch to release it (documented)")
				}
				e := b.New(t)
				const threshold = 200 * time.Millisecond
				gate := newCoreGate()
				handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					gate.pass()
					return nil
				}
				sub := coreNewSub(t, "status-clock", e.Events, e.Checkpoints, handler,
					subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithStuckThreshold(threshold))
				run := start(t, sub)
				defer run.stop(t)
				defer gate.open()
				// Idle for longer than the threshold: not stuck, nothing waits.
				statusWait(t, sub, "idle", func(st subscriptions.Status) bool { return st.State == subscriptions.StateIdle })
				statusHealthyFor(t, sub, 2*threshold)
				before := time.Now()
				statusAppendAged(t, e.Events, "status.late", time.Hour)
				gate.waitEntered(t)
				st, err := sub.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, subscriptions.StateRunning, st.State, "a handler runs: not idle")
				err = sub.Healthy(ctx)
				if time.Since(before) < threshold {
					require.NoError(t, err, "the subscriber was caught up a moment ago")
				}
				require.Eventually(t, func() bool {
					return errors.Is(sub.Healthy(ctx), subscriptions.ErrSubscriberStuck)
				}, 30*time.Second, 5*time.Millisecond)
			})

			t.Run("waiting for a long poll interval is not stuck", func(t *testing.T) {
				e := b.New(t)
				const threshold = 20 * time.Millisecond
				// Polls once an hour and has no wake signal: the event rightly
				// waits for the next poll.
				sub := coreNewSub(t, "status-poll", e.Events, e.Checkpoints, coreNoop,
					subscriptions.WithPollInterval(time.Hour), subscriptions.WithStuckThreshold(threshold))
				start(t, sub)
				statusWait(t, sub, "idle", func(st subscriptions.Status) bool { return st.State == subscriptions.StateIdle })
				statusAppendAged(t, e.Events, "status.late", time.Hour)
				statusHealthyFor(t, sub, 10*threshold)
				st, err := sub.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, subscriptions.StateIdle, st.State)
				require.EqualValues(t, 1, st.Lag, "the event still waits for the poll")
			})

			t.Run("checkpoint ahead of the head", func(t *testing.T) {
				e := b.New(t)
				appendN(t, e.Events, "status.ok", 0, 2)
				sub := coreNewSub(t, "status-ahead", e.Events, e.Checkpoints, coreNoop)
				require.NoError(t, sub.ResetCheckpoint(ctx, 10))
				st, err := sub.Status(ctx)
				require.ErrorIs(t, err, subscriptions.ErrCheckpointAhead)
				require.ErrorContains(t, err, "status-ahead")
				require.Equal(t, "status-ahead", st.Subscriber)
				require.EqualValues(t, 10, st.Position)
				require.EqualValues(t, 2, st.Head)
				require.Zero(t, st.Lag)
				require.Zero(t, st.LagSeconds)
				require.Equal(t, subscriptions.StateStopped, st.State)
				require.ErrorIs(t, sub.Healthy(ctx), subscriptions.ErrCheckpointAhead)
			})

			t.Run("database unreachable", func(t *testing.T) {
				if b.Name == "memory" {
					t.Skip("no database")
				}
				e := b.New(t)
				sub := coreNewSub(t, "status-down", e.Events, e.Checkpoints, coreNoop)
				e.closePool(t)
				_, err := sub.Status(ctx)
				require.Error(t, err)
				err = sub.Healthy(ctx)
				require.ErrorContains(t, err, "status-down")
				for _, sentinel := range []error{subscriptions.ErrSubscriberStopped, subscriptions.ErrSubscriberHalted, subscriptions.ErrSubscriberStuck} {
					require.NotErrorIs(t, err, sentinel)
				}
			})
		})
	}
}

// TestHealthOptionsValidated: the thresholds are checked like every
// option.
func TestHealthOptionsValidated(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	for _, tc := range []struct {
		opt  subscriptions.SubscriberOption
		want string
	}{
		{subscriptions.WithStuckThreshold(0), "WithStuckThreshold"},
		{subscriptions.WithMaxLagTime(-time.Second), "WithMaxLagTime"},
	} {
		_, err := subscriptions.NewSubscriber("opts", e.Events, e.Checkpoints, coreNoop, tc.opt)
		require.ErrorContains(t, err, tc.want)
	}
}
