package pgevents

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// doneOnceDelivered is a context cancelled at the moment its Done is
// first asked for after ready closes: so that an append's outcome and its
// cancellation are ready together when run selects between them.
type doneOnceDelivered struct {
	context.Context // cancelled
	ready           chan struct{}
}

func (c doneOnceDelivered) Done() <-chan struct{} {
	<-c.ready
	return c.Context.Done()
}

func (c doneOnceDelivered) Err() error {
	select {
	case <-c.ready:
		return c.Context.Err()
	default:
		return nil
	}
}

// TestCoalescerOutcomeBeatsCancellation: an outcome that arrived wins
// over a cancellation ready at the same time (select alone picks at
// random, and a stored append would be reported as given up).
func TestCoalescerOutcomeBeatsCancellation(t *testing.T) {
	for range 64 {
		canceled, cancel := context.WithCancel(context.Background())
		cancel()
		ctx := doneOnceDelivered{Context: canceled, ready: make(chan struct{})}
		var c appendCoalescer
		err := c.run(&appendRequest{ctx: ctx, aggregateID: "a", events: make([]domain.EventEnvelope[any], 1)}, func(b *appendBatch) {
			for _, m := range b.members {
				m.done <- nil
			}
			close(ctx.ready)
		})
		require.NoError(t, err)
	}
}

// TestCoalescerLimitFollowsOtherAppenders: the coalescer keeps two
// batches in flight while its committed batches follow one another in the
// feed, one once another store's rows came between two of them, and two
// again when they follow one another again. With one, a second append
// forms behind the batch in flight instead of being sent.
func TestCoalescerLimitFollowsOtherAppenders(t *testing.T) {
	cases := []struct {
		name     string
		observed [][2]int64 // committed batches: (start, end) positions
		want     int
	}{
		{name: "nothing committed yet", want: 2},
		{name: "one batch: nothing to compare with", observed: [][2]int64{{5, 10}}, want: 2},
		{name: "batches follow one another", observed: [][2]int64{{0, 10}, {10, 12}, {12, 20}}, want: 2},
		{name: "another store's rows in between", observed: [][2]int64{{0, 10}, {10, 12}, {15, 20}}, want: 1},
		{name: "following one another again", observed: [][2]int64{{0, 10}, {15, 20}, {20, 21}}, want: 2},
		{name: "seen out of order: decides nothing", observed: [][2]int64{{0, 10}, {15, 20}, {12, 15}}, want: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var co appendCoalescer
			for _, o := range c.observed {
				co.observe(o[0], o[1])
			}
			co.mu.Lock()
			require.Equal(t, c.want, co.limit())
			co.mu.Unlock()

			// Hold the first append's batch; a second one is sent at once
			// under a limit of two, and forms behind it under one.
			release := make(chan struct{})
			var sent atomic.Int32
			runBatch := func(b *appendBatch) {
				if sent.Add(1) == 1 {
					<-release
				}
				for _, m := range b.members {
					m.done <- nil
				}
			}
			ctx := context.Background()
			first := make(chan error, 1)
			go func() {
				first <- co.run(&appendRequest{ctx: ctx, aggregateID: "a", events: make([]domain.EventEnvelope[any], 1)}, runBatch)
			}()
			require.Eventually(t, func() bool { return sent.Load() == 1 }, 10*time.Second, time.Millisecond)
			second := make(chan error, 1)
			go func() {
				second <- co.run(&appendRequest{ctx: ctx, aggregateID: "b", events: make([]domain.EventEnvelope[any], 1)}, runBatch)
			}()
			if c.want == 2 {
				require.NoError(t, <-second, "sent beside the first")
				second <- nil
			} else {
				require.Eventually(t, func() bool {
					co.mu.Lock()
					defer co.mu.Unlock()
					return len(co.forming) == 1
				}, 10*time.Second, time.Millisecond, "formed behind the first")
				require.Equal(t, int32(1), sent.Load())
			}
			close(release)
			require.NoError(t, <-first)
			require.NoError(t, <-second)
			require.Equal(t, int32(2), sent.Load())
		})
	}
}

// TestCoalescerWritersWokenTogetherShareTheNextBatch: writers whose
// appends shared a batch, and who append again as soon as it answers,
// share the next batch too (regather), rather than the first two going
// alone and the others forming behind them, each paying a commit's WAL
// flush under the append lock; and once appends crowd, the store keeps
// one batch in flight, not two, and two again once every append was
// answered. One processor, so that the woken writers run when the
// batch's goroutine yields.
func TestCoalescerWritersWokenTogetherShareTheNextBatch(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	type sent struct {
		size    int
		release chan struct{}
	}
	batches := make(chan sent, 16)
	runBatch := func(b *appendBatch) {
		release := make(chan struct{})
		batches <- sent{len(b.members), release}
		<-release
		for _, m := range b.members {
			m.done <- nil
		}
	}
	var co appendCoalescer
	ctx := context.Background()
	run := func(agg string) error {
		events := []domain.EventEnvelope[any]{{ID: agg + "-event"}}
		return co.run(&appendRequest{ctx: ctx, aggregateID: agg, events: events}, runBatch)
	}
	// Two appends sent at once, held in flight.
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- run("a") }()
	a := <-batches
	go func() { doneB <- run("b") }()
	b := <-batches
	require.Equal(t, 1, a.size)
	require.Equal(t, 1, b.size)

	// Writers that find both slots busy form one batch behind them, and
	// append again once answered.
	const writers = 6
	errs := make(chan error, 2*writers)
	for w := range writers {
		go func() {
			for round := range 2 {
				errs <- run(fmt.Sprintf("w%d-%d", w, round))
			}
		}()
	}
	require.Eventually(t, func() bool {
		co.mu.Lock()
		defer co.mu.Unlock()
		return len(co.forming) == 1 && len(co.forming[0].members) == writers
	}, 10*time.Second, time.Millisecond, "the writers form one batch")
	co.mu.Lock()
	require.Equal(t, 1, co.limit(), "appends crowd: one batch in flight")
	co.mu.Unlock()
	// So the batch waits for both slots to end, not for the first.
	close(a.release)
	require.NoError(t, <-doneA)
	close(b.release)
	require.NoError(t, <-doneB)
	formed := <-batches
	require.Equal(t, writers, formed.size)

	close(formed.release)
	next := <-batches
	require.Equal(t, writers, next.size, "the writers woken together share the next batch")
	close(next.release)
	for range 2 * writers {
		require.NoError(t, <-errs)
	}
	require.Eventually(t, func() bool {
		co.mu.Lock()
		defer co.mu.Unlock()
		return co.inFlight == 0
	}, 10*time.Second, time.Millisecond, "the last batch's slot is freed")
	co.mu.Lock()
	defer co.mu.Unlock()
	require.Equal(t, 2, co.limit(), "every append answered: two in flight again")
}
