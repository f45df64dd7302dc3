package subscriptions_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// deliveryCall is one event of a handler call and the call's Delivery.
type deliveryCall struct {
	phase    int
	id       string
	position int64
	d        subscriptions.Delivery
}

// deliveryLog records what DeliveryFrom says in every handler call, per
// phase of a test; a gate stops the handler in the middle of a phase.
type deliveryLog struct {
	mu    sync.Mutex
	phase int
	calls []deliveryCall
	// The gate: the call that brings the phase's events to gateAt closes
	// reached and blocks until release is closed.
	gateAt, count    int
	reached, release chan struct{}
	// failing events fail (for parking) until fixed.
	failing map[string]bool
}

func (l *deliveryLog) record(ctx context.Context, events ...domain.EventEnvelope[any]) error {
	d := subscriptions.DeliveryFrom(ctx)
	l.mu.Lock()
	var failed error
	for _, ev := range events {
		l.calls = append(l.calls, deliveryCall{phase: l.phase, id: ev.ID, position: ev.Position, d: d})
		if l.failing[ev.ID] {
			failed = errors.New("failing until fixed")
		}
	}
	l.count += len(events)
	gate := l.gateAt > 0 && l.count >= l.gateAt
	if gate {
		l.gateAt = 0
		close(l.reached)
	}
	release := l.release
	l.mu.Unlock()
	if gate {
		<-release
	}
	return failed
}

func (l *deliveryLog) handler(ctx context.Context, ev domain.EventEnvelope[any]) error {
	return l.record(ctx, ev)
}

func (l *deliveryLog) batchHandler(ctx context.Context, events []domain.EventEnvelope[any]) error {
	return l.record(ctx, events...)
}

// next starts phase n; with gateAt > 0 the handler stops at its gateAt-th
// event of the phase (see stopAtGate).
func (l *deliveryLog) next(n, gateAt int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phase, l.count, l.gateAt = n, 0, gateAt
	l.reached, l.release = make(chan struct{}), make(chan struct{})
}

// stopAtGate waits for the gate, stops r while the handler waits there
// (the batch in flight drains and commits) and lets the handler go.
func (l *deliveryLog) stopAtGate(t *testing.T, r *running) {
	t.Helper()
	select {
	case <-l.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not reach the gate")
	}
	r.cancel()
	close(l.release)
	r.stop(t)
}

// of returns the calls of phase n.
func (l *deliveryLog) of(n int) []deliveryCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []deliveryCall
	for _, c := range l.calls {
		if c.phase == n {
			out = append(out, c)
		}
	}
	return out
}

// requireSeen fails unless every event of want was delivered in calls.
func requireSeen(t *testing.T, calls []deliveryCall, want []domain.EventEnvelope[any]) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range calls {
		seen[c.id] = true
	}
	for _, ev := range want {
		require.True(t, seen[ev.ID], "event at %d was not delivered", ev.Position)
	}
}

// deliveryVariant is how a subscriber of the delivery tests runs: with a
// Handler or a BatchHandler, partitioned or not.
type deliveryVariant struct {
	name       string
	partitions int
	batch      bool
}

// deliveryVariants are a Handler, a BatchHandler, and a partitioned
// BatchHandler (whose partitions' runners are the unpartitioned ones'
// with a checkpoint each).
var deliveryVariants = []deliveryVariant{
	{"handler", 0, false},
	{"batch-handler", 0, true},
	{"partitioned-batch-handler", 3, true},
}

// subscriber returns a Subscriber of name over the stores, recording in
// log, with batches of four so that batches cross the marks (3..6, ..., 19..22 in
// TestDeliveryAcrossResetsAndRestarts).
func (v deliveryVariant) subscriber(t *testing.T, name string, events domain.EventStore, cps subscriptions.CheckpointStore, log *deliveryLog, opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
	t.Helper()
	opts = append([]subscriptions.SubscriberOption{subscriptions.WithBatchSize(4), subscriptions.WithPollInterval(5 * time.Millisecond),
		subscriptions.WithLogger(quietLogger())}, opts...)
	handler := log.handler
	if v.batch {
		handler = nil
		opts = append(opts, subscriptions.WithBatchHandler(log.batchHandler))
	}
	if v.partitions > 0 {
		opts = append(opts, subscriptions.WithPartitions(v.partitions))
	}
	sub, err := subscriptions.NewSubscriber(name, events, cps, handler, opts...)
	require.NoError(t, err)
	return sub
}

// feedOf reads the whole feed: the events with their positions.
func feedOf(t *testing.T, store domain.EventStore) []domain.EventEnvelope[any] {
	t.Helper()
	feed, err := store.ReadAfter(context.Background(), 0, 0)
	require.NoError(t, err)
	return feed
}

// lastOfPartition returns, for a partitioned variant, the position of the
// last event up to through of ev's partition (the partition's checkpoint
// once it has handled them), else through.
func (v deliveryVariant) lastOfPartition(feed []domain.EventEnvelope[any], ev deliveryCall, aggregate map[string]string, through int64) int64 {
	if v.partitions == 0 {
		return through
	}
	p := subscriptions.PartitionOf(aggregate[ev.id], v.partitions)
	var last int64
	for _, f := range feed {
		if f.Position <= through && subscriptions.PartitionOf(f.AggregateID, v.partitions) == p {
			last = f.Position
		}
	}
	return last
}

// TestDeliveryAcrossResetsAndRestarts: a handler (and a batch handler,
// partitioned or not) is told live from re-delivery where a user sees it.
// Events handled once are live. After ResetCheckpointWith to P while the
// subscriber runs, the events from P up to the old checkpoint come as
// re-deliveries through it. The subscriber is stopped in the middle of
// the rebuild and reset again, further back: the mark keeps the first
// reset's checkpoint. After a restart (new stores, two replicas, as two
// processes) every event up to the old checkpoint is still a re-delivery
// and the events appended since are live, batches cut where the nature
// changes. DeleteState forgets it all: the name then starts live.
func TestDeliveryAcrossResetsAndRestarts(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, v := range deliveryVariants {
				t.Run(v.name, func(t *testing.T) {
					e := b.New(t)
					ctx := context.Background()
					log := &deliveryLog{}
					const name = "emails"
					seq := map[string]int{}
					history := partAppend(t, e.Events, seq, 6, 20)
					feed := feedOf(t, e.Events)
					aggregate := map[string]string{}
					for _, ev := range feed {
						aggregate[ev.ID] = ev.AggregateID
					}
					reset, old := feed[4].Position, feed[19].Position

					// 1: live.
					log.next(1, 0)
					sub := v.subscriber(t, name, e.Events, e.Checkpoints, log)
					run := start(t, sub)
					waitCaughtUp(t, sub)
					calls := log.of(1)
					requireSeen(t, calls, history)
					for _, c := range calls {
						require.Equal(t, subscriptions.Delivery{}, c.d, "first delivery of %d", c.position)
					}

					// 2: a rebuild in place while it runs, stopped in the middle.
					log.next(2, 4)
					require.NoError(t, sub.ResetCheckpointWith(ctx, reset, func(context.Context) error { return nil }))
					log.stopAtGate(t, run)
					lag, err := sub.Lag(ctx)
					require.NoError(t, err)
					require.Positive(t, lag, "stopped in the middle of the rebuild")
					calls = log.of(2)
					require.NotEmpty(t, calls)
					for _, c := range calls {
						require.Greater(t, c.position, reset)
						require.Equal(t, subscriptions.DeliveryRedelivery, c.d.Kind, "re-delivery of %d", c.position)
						require.Equal(t, v.lastOfPartition(feed, c, aggregate, old), c.d.Through, "the checkpoint before the reset, of %d", c.position)
					}

					// A second reset during the rebuild, further back, while
					// nothing runs; then more events.
					again := feed[1].Position
					require.NoError(t, sub.ResetCheckpoint(ctx, again))
					fresh := partAppend(t, e.Events, seq, 6, 5)
					feed = feedOf(t, e.Events)
					for _, ev := range feed {
						aggregate[ev.ID] = ev.AggregateID
					}

					// 3: a restart, as two processes.
					log.next(3, 0)
					var subs []*subscriptions.Subscriber
					var runs []*running
					for range 2 {
						events, cps, _ := partReplica(t, e)
						replica := v.subscriber(t, name, events, cps, log)
						subs = append(subs, replica)
						runs = append(runs, start(t, replica))
					}
					for _, replica := range subs {
						waitCaughtUp(t, replica)
					}
					calls = log.of(3)
					requireSeen(t, calls, append(history[2:], fresh...))
					for _, c := range calls {
						require.Greater(t, c.position, again)
						if c.position > old {
							require.Equal(t, subscriptions.Delivery{}, c.d, "%d was never delivered before", c.position)
							continue
						}
						require.Equal(t, subscriptions.DeliveryRedelivery, c.d.Kind, "re-delivery of %d after a restart", c.position)
						require.Equal(t, v.lastOfPartition(feed, c, aggregate, old), c.d.Through, "the highest checkpoint before the resets, of %d", c.position)
					}

					// 4: DeleteState forgets the marks: the name starts live.
					for _, r := range runs {
						r.stop(t)
					}
					require.NoError(t, subs[0].DeleteState(ctx))
					log.next(4, 0)
					sub = v.subscriber(t, name, e.Events, e.Checkpoints, log)
					start(t, sub)
					waitCaughtUp(t, sub)
					calls = log.of(4)
					requireSeen(t, calls, append(history, fresh...))
					for _, c := range calls {
						require.Equal(t, subscriptions.Delivery{}, c.d, "%d after DeleteState", c.position)
					}
				})
			}
		})
	}
}

// TestDeliveryOfParkedReplays: a parked event's handler attempts are live,
// and its replay, by ReplayParked or ReplayParkedMatching, with a Handler
// and with a partitioned BatchHandler, is a parked replay; the events
// around it stay live.
func TestDeliveryOfParkedReplays(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, v := range []deliveryVariant{deliveryVariants[0], deliveryVariants[2]} {
				t.Run(v.name, func(t *testing.T) {
					e := b.New(t)
					ctx := context.Background()
					history := partAppend(t, e.Events, map[string]int{}, 6, 12)
					poison := []string{history[3].ID, history[8].ID}
					log := &deliveryLog{failing: map[string]bool{poison[0]: true, poison[1]: true}}
					log.next(1, 0)
					sub := v.subscriber(t, "parking", e.Events, e.Checkpoints, log, subscriptions.WithParkingLot(e.Parking),
						subscriptions.WithMaxRetries(1), subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond))
					run := start(t, sub)
					waitCaughtUp(t, sub)
					run.stop(t)
					parked, err := sub.ListParked(ctx)
					require.NoError(t, err)
					require.Len(t, parked, 2)
					calls := log.of(1)
					requireSeen(t, calls, history)
					for _, c := range calls {
						require.Equal(t, subscriptions.Delivery{}, c.d, "every attempt at %d is live", c.position)
					}

					log.mu.Lock()
					clear(log.failing)
					log.mu.Unlock()
					log.next(2, 0)
					require.NoError(t, sub.ReplayParked(ctx, poison[0]))
					res, err := sub.ReplayParkedMatching(ctx, subscriptions.ParkedFilter{}, false)
					require.NoError(t, err)
					require.Equal(t, []string{poison[1]}, res.Replayed)
					calls = log.of(2)
					require.Len(t, calls, 2)
					for i, c := range calls {
						require.Equal(t, poison[i], c.id)
						require.Equal(t, subscriptions.Delivery{Kind: subscriptions.DeliveryParkedReplay}, c.d)
						require.True(t, c.d.Replay())
					}
				})
			}
		})
	}
}

// TestFirstRunCatchUp: WithFirstRunCatchUp makes the first start of a
// name (the new version of a blue/green rebuild) deliver the history up to
// the head at that start as catch-up, durably: after a restart in the
// middle of the catch-up (new stores, two replicas) the rest of that
// history is still catch-up and what was appended since is live. A
// history no longer than the threshold is live, a name that ran before
// gets no catch-up, and after DeleteState the name's next start is a
// first start again, up to the head then.
func TestFirstRunCatchUp(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, v := range []deliveryVariant{deliveryVariants[0], deliveryVariants[2]} {
				t.Run(v.name, func(t *testing.T) {
					e := b.New(t)
					ctx := context.Background()
					seq := map[string]int{}
					history := partAppend(t, e.Events, seq, 6, 10)
					head := feedOf(t, e.Events)[9].Position
					catchUp := subscriptions.WithFirstRunCatchUp(0)
					// requireDelivered checks every call of log's phase: a
					// catch-up through through up to it, live after it.
					requireDelivered := func(t *testing.T, calls []deliveryCall, through int64) {
						t.Helper()
						for _, c := range calls {
							want := subscriptions.Delivery{Kind: subscriptions.DeliveryCatchUp, Through: through}
							if c.position > through {
								want = subscriptions.Delivery{}
							}
							require.Equal(t, want, c.d, "event at %d", c.position)
						}
					}

					// A name that ran before the option gets no catch-up.
					v1Log := &deliveryLog{}
					v1 := v.subscriber(t, "v1", e.Events, e.Checkpoints, v1Log)
					run := start(t, v1)
					waitCaughtUp(t, v1)
					run.stop(t)

					// v2's first start, stopped in the middle of its catch-up.
					v2Log := &deliveryLog{}
					v2Log.next(1, 3)
					v2 := v.subscriber(t, "v2", e.Events, e.Checkpoints, v2Log, catchUp)
					v2Log.stopAtGate(t, start(t, v2))
					lag, err := v2.Lag(ctx)
					require.NoError(t, err)
					require.Positive(t, lag, "stopped in the middle of the catch-up")
					fresh := partAppend(t, e.Events, seq, 6, 5)

					// The restart, as two processes; v1 again with the
					// option; a name whose history is within its threshold.
					v2Log.next(2, 0)
					var runs []*running
					var subs []*subscriptions.Subscriber
					for range 2 {
						events, cps, _ := partReplica(t, e)
						replica := v.subscriber(t, "v2", events, cps, v2Log, catchUp)
						subs = append(subs, replica)
						runs = append(runs, start(t, replica))
					}
					v1Log.next(2, 0)
					v1 = v.subscriber(t, "v1", e.Events, e.Checkpoints, v1Log, catchUp)
					smallLog := &deliveryLog{}
					small := v.subscriber(t, "small", e.Events, e.Checkpoints, smallLog, subscriptions.WithFirstRunCatchUp(100))
					for _, sub := range append(subs, v1, small) {
						if sub == v1 || sub == small {
							runs = append(runs, start(t, sub))
						}
						waitCaughtUp(t, sub)
					}
					for _, r := range runs {
						r.stop(t)
					}
					all := append(history, fresh...)
					requireSeen(t, append(v2Log.of(1), v2Log.of(2)...), all)
					requireDelivered(t, append(v2Log.of(1), v2Log.of(2)...), head)
					requireSeen(t, v1Log.of(2), fresh)
					requireDelivered(t, v1Log.of(2), 0)
					requireSeen(t, smallLog.of(0), all)
					requireDelivered(t, smallLog.of(0), 0)

					// A retired name starts afresh: a first start again.
					require.NoError(t, v2.DeleteState(ctx))
					v2Log.next(3, 0)
					v2 = v.subscriber(t, "v2", e.Events, e.Checkpoints, v2Log, catchUp)
					start(t, v2)
					waitCaughtUp(t, v2)
					requireSeen(t, v2Log.of(3), all)
					requireDelivered(t, v2Log.of(3), feedOf(t, e.Events)[14].Position)
				})
			}
		})
	}
}

// TestFirstRunCatchUpIsChecked: NewSubscriber refuses a negative
// threshold, and the option on a checkpoint store that cannot record the
// catch-up (errors.ErrUnsupported), rather than deliver the history as
// live.
func TestFirstRunCatchUpIsChecked(t *testing.T) {
	t.Parallel()
	handler := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	events := infrastructure.NewMemoryStore()
	_, err := subscriptions.NewSubscriber("negative", events, subscriptions.NewMemoryCheckpointStore(), handler, subscriptions.WithFirstRunCatchUp(-1))
	require.ErrorContains(t, err, "WithFirstRunCatchUp")
	plain := struct{ subscriptions.CheckpointStore }{subscriptions.NewMemoryCheckpointStore()}
	_, err = subscriptions.NewSubscriber("unmarked", events, plain, handler, subscriptions.WithFirstRunCatchUp(0))
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.ErrorContains(t, err, "DeliveryMarker")
}

// TestDeliveryAcrossARepartition: a Repartition in the middle of a
// rebuild keeps telling re-deliveries from live ones, with a Handler and
// a BatchHandler. After a reset of three partitions, the rebuild stops
// with one partition behind (its events fail) and the others past the
// middle; Repartition to two partitions catches the laggard up with
// re-deliveries (each through its own partition's old checkpoint). The
// new partitions then re-deliver up to the lowest of the old partitions'
// marks and deliver live past it: an event an old partition had handled
// past that mark comes live again (a side effect may repeat; none that
// never happened is skipped).
func TestDeliveryAcrossARepartition(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, v := range []deliveryVariant{{"partitioned-handler", 3, false}, {"partitioned-batch-handler", 3, true}} {
				t.Run(v.name, func(t *testing.T) {
					e := b.New(t)
					ctx := context.Background()
					log := &deliveryLog{failing: map[string]bool{}}
					const name = "emails"
					seq := map[string]int{}
					partAppend(t, e.Events, seq, 9, 45)
					feed := feedOf(t, e.Events)
					partOf := map[string]int{}
					marks := make([]int64, 3) // each old partition's checkpoint before the reset: its last event
					for _, ev := range feed {
						partOf[ev.ID] = subscriptions.PartitionOf(ev.AggregateID, 3)
						marks[partOf[ev.ID]] = ev.Position
					}
					require.NotContains(t, marks, int64(0), "every partition has events")
					low := slices.Min(marks)
					reset, mid := feed[4].Position, feed[24].Position

					// 1: live, then a reset for a rebuild.
					log.next(1, 0)
					sub := v.subscriber(t, name, e.Events, e.Checkpoints, log)
					run := start(t, sub)
					waitCaughtUp(t, sub)
					run.stop(t)
					require.NoError(t, sub.ResetCheckpoint(ctx, reset))

					// 2: the rebuild, stopped with the partitions apart.
					behind := partOf[feed[5].ID]
					var ahead []domain.EventEnvelope[any]
					for _, ev := range feed[5:] {
						if partOf[ev.ID] == behind || ev.Position > mid {
							log.failing[ev.ID] = true
						} else {
							ahead = append(ahead, ev)
						}
					}
					log.next(2, 0)
					run = start(t, sub)
					require.Eventually(t, func() bool {
						seen := map[string]bool{}
						for _, c := range log.of(2) {
							seen[c.id] = true
						}
						for _, ev := range ahead {
							if !seen[ev.ID] {
								return false
							}
						}
						return true
					}, 30*time.Second, 5*time.Millisecond, "the partitions ahead reach the middle")
					run.stop(t)
					log.mu.Lock()
					log.failing = nil
					log.mu.Unlock()

					// 3: Repartition's catch-up re-delivers.
					log.next(3, 0)
					require.NoError(t, sub.Repartition(ctx, 2))
					target, err := e.Checkpoints.Position(ctx, name+"/partition-0-of-2")
					require.NoError(t, err)
					require.Greater(t, target, reset)
					calls := log.of(3)
					require.NotEmpty(t, calls, "the partition behind caught up")
					for _, c := range calls {
						require.Greater(t, c.position, reset)
						require.LessOrEqual(t, c.position, target)
						require.Equal(t, subscriptions.Delivery{Kind: subscriptions.DeliveryRedelivery, Through: marks[partOf[c.id]]}, c.d,
							"catch-up of %d, under its old partition's mark", c.position)
					}

					// 4: the new layout re-delivers up to the lowest mark.
					require.Less(t, target, low, "the rebuild is still under way")
					fresh := partAppend(t, e.Events, seq, 9, 9)
					feed = feedOf(t, e.Events)
					log.next(4, 0)
					sub = deliveryVariant{v.name, 2, v.batch}.subscriber(t, name, e.Events, e.Checkpoints, log)
					start(t, sub)
					waitCaughtUp(t, sub)
					calls = log.of(4)
					var rest []domain.EventEnvelope[any]
					for _, ev := range feed {
						if ev.Position > target {
							rest = append(rest, ev)
						}
					}
					requireSeen(t, calls, append(rest, fresh...))
					for _, c := range calls {
						require.Greater(t, c.position, target)
						if c.position <= low {
							require.Equal(t, subscriptions.Delivery{Kind: subscriptions.DeliveryRedelivery, Through: low}, c.d, "re-delivery of %d", c.position)
						} else {
							require.Equal(t, subscriptions.Delivery{}, c.d, "%d past the lowest mark", c.position)
						}
					}
				})
			}
		})
	}
}
