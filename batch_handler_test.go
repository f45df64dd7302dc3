package subscriptions_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// TestBatchHandlerSuite runs WithBatchHandler against every backend,
// unpartitioned and with partitions: whole batches in one call, and a
// poison event in the middle of a batch found, retried and parked alone
// while every other event commits once.
func TestBatchHandlerSuite(t *testing.T) {
	t.Parallel()
	const poll = 20 * time.Millisecond
	for _, b := range envBackends() {
		for _, parts := range []int{0, 4} {
			name := b.Name
			opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(20), subscriptions.WithPollInterval(poll)}
			if parts > 0 {
				name += "/partitioned"
				opts = append(opts, subscriptions.WithPartitions(parts), subscriptions.WithConcurrency(2))
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				t.Run("whole batches in one call, each event once", func(t *testing.T) {
					e := b.New(t)
					proj := newPartProjection(t, e, "batch_whole")
					project := proj.handler(true)
					var mu sync.Mutex
					sizes := []int{}
					h := func(ctx context.Context, events []domain.EventEnvelope[any]) error {
						mu.Lock()
						sizes = append(sizes, len(events))
						mu.Unlock()
						for _, ev := range events {
							if err := project(ctx, ev); err != nil {
								return err
							}
						}
						return nil
					}
					want := partAppend(t, e.Events, map[string]int{}, 8, 100)
					sub := coreNewSub(t, "batch-whole", e.Events, e.Checkpoints, nil,
						append(opts, subscriptions.WithBatchHandler(h))...)
					start(t, sub)
					waitCaughtUp(t, sub)
					handled := proj.handled(t)
					for _, ev := range want {
						require.Equal(t, 1, handled[ev.ID], "event %s", ev.ID)
					}
					require.Empty(t, proj.orderViolations())
					mu.Lock()
					defer mu.Unlock()
					require.Less(t, len(sizes), len(want), "the handler was called once per event: %v", sizes)
				})

				t.Run("a poison event in a batch is parked alone", func(t *testing.T) {
					e := b.New(t)
					proj := newPartProjection(t, e, "batch_poison")
					project := proj.handler(false)
					want := partAppend(t, e.Events, map[string]int{}, 8, 100)
					poison := want[45]
					var mu sync.Mutex
					calls := map[string]int{} // handler calls with the poison event, by batch size
					h := func(ctx context.Context, events []domain.EventEnvelope[any]) error {
						for _, ev := range events {
							if ev.ID == poison.ID {
								mu.Lock()
								if len(events) == 1 {
									calls["alone"]++
								} else {
									calls["in a batch"]++
								}
								mu.Unlock()
								return errors.New("poison")
							}
							if err := project(ctx, ev); err != nil {
								return err
							}
						}
						return nil
					}
					sub := coreNewSub(t, "batch-poison", e.Events, e.Checkpoints, nil,
						append(opts, subscriptions.WithBatchHandler(h), subscriptions.WithParkingLot(e.Parking),
							subscriptions.WithMaxRetries(2), subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond))...)
					start(t, sub)
					waitCaughtUp(t, sub)
					parked, err := sub.ListParked(context.Background())
					require.NoError(t, err)
					require.Len(t, parked, 1)
					require.Equal(t, poison.ID, parked[0].EventID)
					require.Equal(t, 3, parked[0].Attempts)
					mu.Lock()
					require.Equal(t, map[string]int{"in a batch": 1, "alone": 3}, calls)
					mu.Unlock()

					handled := proj.handled(t)
					require.NotContains(t, handled, poison.ID)
					for _, ev := range want {
						if ev.ID == poison.ID {
							continue
						}
						if e.DB != nil {
							// The failed batch's writes were rolled back.
							require.Equal(t, 1, handled[ev.ID], "event %s", ev.ID)
						} else {
							require.Positive(t, handled[ev.ID], "event %s", ev.ID)
						}
					}
				})
			})
		}
	}
}

// TestBatchHandlerOptionIsValidated: a batch handler replaces the Handler;
// giving both is refused.
func TestBatchHandlerOptionIsValidated(t *testing.T) {
	t.Parallel()
	events, cps := subscriptionsMemory()
	h := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	bh := func(context.Context, []domain.EventEnvelope[any]) error { return nil }
	_, err := subscriptions.NewSubscriber("both", events, cps, h, subscriptions.WithBatchHandler(bh))
	require.ErrorContains(t, err, "not both")
	_, err = subscriptions.NewSubscriber("neither", events, cps, nil)
	require.ErrorContains(t, err, "nil handler")
	_, err = subscriptions.NewSubscriber("batch", events, cps, nil, subscriptions.WithBatchHandler(bh))
	require.NoError(t, err)
}

func subscriptionsMemory() (domain.EventStore, subscriptions.CheckpointStore) {
	return infrastructure.NewMemoryStore(), subscriptions.NewMemoryCheckpointStore()
}

// TestBatchHandlerShutdownGrace: a batch handler still running when the
// shutdown grace runs out has its batch rolled back, even if it then
// returns nil, and Run returns; the events are handled after a restart.
func TestBatchHandlerShutdownGrace(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			proj := newPartProjection(t, e, "batch_grace")
			project := proj.handler(false)
			want := partAppend(t, e.Events, map[string]int{}, 4, 10)
			entered := make(chan struct{}, 1)
			block := true
			h := func(ctx context.Context, events []domain.EventEnvelope[any]) error {
				for _, ev := range events {
					if err := project(ctx, ev); err != nil {
						return err
					}
				}
				if block {
					entered <- struct{}{}
					<-ctx.Done()
				}
				return nil // the grace's cut must roll back even a nil
			}
			opts := []subscriptions.SubscriberOption{subscriptions.WithBatchHandler(h), subscriptions.WithShutdownGrace(20 * time.Millisecond)}
			sub := coreNewSub(t, "batch-grace", e.Events, e.Checkpoints, nil, opts...)
			run := start(t, sub)
			<-entered
			run.stop(t)
			lag, err := sub.Lag(context.Background())
			require.NoError(t, err)
			require.Equal(t, int64(len(want)), lag, "the cut batch committed")

			block = false
			sub = coreNewSub(t, "batch-grace", e.Events, e.Checkpoints, nil, opts...)
			start(t, sub)
			waitCaughtUp(t, sub)
			if e.DB != nil {
				handled := proj.handled(t)
				for _, ev := range want {
					require.Equal(t, 1, handled[ev.ID], "event %s", ev.ID)
				}
			}
		})
	}
}

// batchDeposit is TestTypedBatch's payload.
type batchDeposit struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

// TestTypedBatch: TypedBatch hands a batch handler its events with their
// payloads decoded into the handler's type, on every backend (a database
// gives them back as JSON); an event whose payload cannot be decoded is
// parked alone with an error naming it and both types, before the handler
// sees it, and every other event reaches the handler.
func TestTypedBatch(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			ctx := context.Background()
			var good []string
			var bad string
			for i := range 9 {
				var payload any = batchDeposit{Account: "acc", Amount: i}
				if i == 4 {
					payload = "not a deposit"
				}
				ev := domain.NewEventEnvelope[any](payload, "acc", "batch.deposited", 0)
				require.NoError(t, e.Events.Append(ctx, "acc", -1, ev))
				if i == 4 {
					bad = ev.ID
				} else {
					good = append(good, ev.ID)
				}
			}
			var mu sync.Mutex
			total, calls := 0, map[string]int{}
			sub, err := subscriptions.NewSubscriber("typed-batch", e.Events, e.Checkpoints, nil,
				subscriptions.WithBatchHandler(subscriptions.TypedBatch(func(ctx context.Context, deposits []domain.EventEnvelope[batchDeposit]) error {
					mu.Lock()
					defer mu.Unlock()
					for _, d := range deposits {
						require.Equal(t, "acc", d.Payload.Account, "decoded into the handler's type")
						total += d.Payload.Amount
						calls[d.ID]++
					}
					return nil
				})),
				subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0),
				subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			run := start(t, sub)
			parked := parkWaitParked(t, sub, 1)
			waitCaughtUp(t, sub)
			run.stop(t)
			require.Equal(t, bad, parked[0].EventID)
			require.Contains(t, parked[0].Error, "batchDeposit")
			require.Contains(t, parked[0].Error, bad)
			mu.Lock()
			defer mu.Unlock()
			for _, id := range good {
				require.GreaterOrEqual(t, calls[id], 1, id)
			}
			require.Len(t, calls, len(good))
			require.Zero(t, calls[bad])
		})
	}
}
