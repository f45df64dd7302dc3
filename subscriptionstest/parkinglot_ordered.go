package subscriptionstest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// RunOrderedParkingLotSuite runs the contract of
// subscriptions.OrderedParkingLot, the per-aggregate queues that
// subscriptions.WithOrderedParking needs, against the lot h builds, as
// subtests of t named h.Name/OrderedParkingLot/<case> (skipped when the
// lot does not have it). RunParkingLotSuite runs it. Outside a batch (no
// transaction in the context) each call takes effect at once.
func RunOrderedParkingLotSuite(t *testing.T, h ParkingLotHarness) {
	ctx := context.Background()
	entry := func(subscriber, eventID, aggregate string, position int64) subscriptions.ParkedEvent {
		p := parkEntry(subscriber, eventID, position)
		p.AggregateID = aggregate
		return p
	}
	held := func(subscriber, eventID, aggregate string, position int64) subscriptions.ParkedEvent {
		p := entry(subscriber, eventID, aggregate, position)
		p.Error, p.Attempts = "", 0
		return p
	}
	// queue reads the subscriber's entries as "id<-head" (held) or "id".
	queue := func(t *testing.T, lot subscriptions.OrderedParkingLot, subscriber string) []string {
		t.Helper()
		got, err := lot.List(ctx, subscriber)
		require.NoError(t, err)
		out := make([]string, len(got))
		for i, p := range got {
			out[i] = p.EventID
			if p.HeldBy != "" {
				out[i] += "<-" + p.HeldBy
			}
		}
		return out
	}
	heads := func(t *testing.T, lot subscriptions.OrderedParkingLot, subscriber string) map[string]string {
		t.Helper()
		got, err := lot.ParkedHeads(ctx, subscriber)
		require.NoError(t, err)
		out := map[string]string{}
		for _, p := range got {
			_, dup := out[p.AggregateID]
			require.False(t, dup, "one head per aggregate")
			out[p.AggregateID] = p.EventID
		}
		return out
	}
	// seed parks h10 (aggregate a) and holds e20, e30 behind it.
	seed := func(t *testing.T, lot subscriptions.OrderedParkingLot) {
		t.Helper()
		require.NoError(t, lot.Park(ctx, entry("q-a", "h10", "a", 10)))
		for _, p := range []subscriptions.ParkedEvent{held("q-a", "e20", "a", 20), held("q-a", "e30", "a", 30)} {
			head, err := lot.Hold(ctx, p)
			require.NoError(t, err)
			require.Equal(t, "h10", head)
		}
	}
	run := func(name string, f func(t *testing.T, lot subscriptions.OrderedParkingLot)) {
		t.Run(h.Name+"/OrderedParkingLot/"+name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			f(t, has[subscriptions.OrderedParkingLot](t, h.New(t)))
		})
	}

	run("hold behind the head", func(t *testing.T, lot subscriptions.OrderedParkingLot) {
		seed(t, lot)
		for _, p := range []subscriptions.ParkedEvent{
			held("q-a", "b25", "b", 25), // no queue of b
			held("q-a", "e05", "a", 5),  // nothing of a before it
			held("q-b", "e40", "a", 40), // another subscriber's a
			held("q-a", "n50", "", 50),  // no aggregate
		} {
			head, err := lot.Hold(ctx, p)
			require.NoError(t, err)
			require.Empty(t, head, "%s: no entry of its aggregate before it", p.EventID)
		}
		require.Equal(t, []string{"h10", "e20<-h10", "e30<-h10"}, queue(t, lot, "q-a"), "held entries name their head; a refused hold writes nothing")
		require.Empty(t, queue(t, lot, "q-b"))
		got, err := lot.Get(ctx, "q-a", "e20")
		require.NoError(t, err)
		parkRequireSame(t, subscriptions.ParkedEvent{Subscriber: "q-a", EventID: "e20", EventType: "park.suite", Position: 20,
			ParkedAt: parkAt(20 * time.Second), AggregateID: "a", HeldBy: "h10"}, got)
		page, err := lot.ListFiltered(ctx, "q-a", subscriptions.ParkedFilter{AggregateID: "a", AfterPosition: 20})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, "h10", page[0].HeldBy, "a page without the head still names it")
		require.Equal(t, map[string]string{"a": "h10"}, heads(t, lot, "q-a"))
		n, err := lot.CountHeld(ctx, "q-a")
		require.NoError(t, err)
		require.Equal(t, 2, n)

		head, err := lot.Hold(ctx, held("q-a", "e20", "a", 20))
		require.NoError(t, err)
		require.Equal(t, "h10", head, "held again")
		require.Equal(t, []string{"h10", "e20<-h10", "e30<-h10"}, queue(t, lot, "q-a"))
		require.NoError(t, lot.Park(ctx, entry("q-a", "h10", "a", 10)), "the head parked again")
		require.Equal(t, []string{"h10", "e20<-h10", "e30<-h10"}, queue(t, lot, "q-a"))
	})

	run("heads of several queues", func(t *testing.T, lot subscriptions.OrderedParkingLot) {
		for _, p := range []subscriptions.ParkedEvent{
			entry("q-a", "a10", "a", 10), entry("q-a", "a15", "a", 15), // two failures of a: the first heads
			entry("q-a", "b20", "b", 20), entry("q-a", "n30", "", 30), entry("q-b", "a5", "a", 5),
		} {
			require.NoError(t, lot.Park(ctx, p))
		}
		head, err := lot.Hold(ctx, held("q-a", "a40", "a", 40))
		require.NoError(t, err)
		require.Equal(t, "a10", head)
		require.Equal(t, map[string]string{"a": "a10", "b": "b20"}, heads(t, lot, "q-a"), "no aggregate, no queue")
		require.Equal(t, map[string]string{"a": "a5"}, heads(t, lot, "q-b"))
		require.Empty(t, heads(t, lot, "q-nobody"))
	})

	run("the next entry heads the queue when the head leaves", func(t *testing.T, lot subscriptions.OrderedParkingLot) {
		seed(t, lot)
		ev := func(id string, position int64) domain.EventEnvelope[any] {
			return domain.EventEnvelope[any]{ID: id, AggregateID: "a", EventType: "park.suite", Position: position}
		}
		require.Error(t, lot.Replay(ctx, "q-a", "h10", ev("h10", 10), func(context.Context, domain.EventEnvelope[any]) error {
			return context.DeadlineExceeded
		}))
		require.Equal(t, []string{"h10", "e20<-h10", "e30<-h10"}, queue(t, lot, "q-a"), "a failed replay changes nothing")

		require.NoError(t, lot.Replay(ctx, "q-a", "h10", ev("h10", 10), func(context.Context, domain.EventEnvelope[any]) error { return nil }))
		require.Equal(t, []string{"e20", "e30<-e20"}, queue(t, lot, "q-a"), "replayed: the next heads")
		require.Equal(t, map[string]string{"a": "e20"}, heads(t, lot, "q-a"))

		p, err := lot.Discard(ctx, "q-a", "e30")
		require.NoError(t, err)
		require.Equal(t, "e20", p.HeldBy, "the discarded entry as it was")
		require.Equal(t, []string{"e20"}, queue(t, lot, "q-a"), "a held entry discarded: the head stays")
		head, err := lot.Hold(ctx, held("q-a", "e30", "a", 30))
		require.NoError(t, err)
		require.Equal(t, "e20", head)

		_, err = lot.Discard(ctx, "q-a", "e20")
		require.NoError(t, err)
		require.Equal(t, []string{"e30"}, queue(t, lot, "q-a"), "discarded: the next heads")
		require.Equal(t, map[string]string{"a": "e30"}, heads(t, lot, "q-a"))
		n, err := lot.CountHeld(ctx, "q-a")
		require.NoError(t, err)
		require.Zero(t, n)
	})

	run("the next entry heads the queue when delivered entries go", func(t *testing.T, lot subscriptions.OrderedParkingLot) {
		seed(t, lot)
		c := has[subscriptions.DeliveredClearer](t, lot)
		require.NoError(t, c.ClearDelivered(ctx, "q-a", 0, 20), "the head and the first held, delivered again after a reset")
		require.Equal(t, []string{"e30"}, queue(t, lot, "q-a"))
		require.Equal(t, map[string]string{"a": "e30"}, heads(t, lot, "q-a"))

		pc := has[subscriptions.PartitionDeliveredClearer](t, lot)
		require.NoError(t, lot.Park(ctx, entry("q-b", "h10", "a", 10)))
		for _, id := range []string{"e20", "e30"} {
			head, err := lot.Hold(ctx, held("q-b", id, "a", map[string]int64{"e20": 20, "e30": 30}[id]))
			require.NoError(t, err)
			require.Equal(t, "h10", head)
		}
		const n = 2
		p := subscriptions.PartitionOf("a", n)
		require.NoError(t, pc.ClearPartitionDelivered(ctx, "q-b", 1-p, n, 0, 15), "another partition's: nothing goes")
		require.Equal(t, []string{"h10", "e20<-h10", "e30<-h10"}, queue(t, lot, "q-b"))
		require.NoError(t, pc.ClearPartitionDelivered(ctx, "q-b", p, n, 0, 15))
		require.Equal(t, []string{"e20", "e30<-e20"}, queue(t, lot, "q-b"))

		purger := has[subscriptions.ParkingLotPurger](t, lot)
		require.NoError(t, purger.Purge(ctx, "q-b"))
		require.Empty(t, queue(t, lot, "q-b"))
	})

	run("a hold racing a replay of its head is held behind the queue", func(t *testing.T, lot subscriptions.OrderedParkingLot) {
		require.NoError(t, lot.Park(ctx, entry("q-a", "h10", "a", 10)))
		head, err := lot.Hold(ctx, held("q-a", "e20", "a", 20))
		require.NoError(t, err)
		require.Equal(t, "h10", head)
		entered, release := make(chan struct{}), make(chan struct{})
		releaseOnce := sync.OnceFunc(func() { close(release) })
		defer releaseOnce()
		replayed := make(chan error, 1)
		go func() {
			replayed <- lot.Replay(ctx, "q-a", "h10", domain.EventEnvelope[any]{ID: "h10", AggregateID: "a", Position: 10},
				func(context.Context, domain.EventEnvelope[any]) error {
					close(entered)
					<-release
					return nil
				})
		}()
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the replay never ran its handler")
		}
		// A lot with row locks holds at once, behind the head being
		// replayed; one that serializes writers (SQLite) holds after the
		// replay, behind the entry it made the head. Either way e20 is
		// still there before e30: a hold that finds no head here would let
		// e30 be handled before it.
		type result struct {
			head string
			err  error
		}
		holding := make(chan result, 1)
		go func() {
			head, err := lot.Hold(ctx, held("q-a", "e30", "a", 30))
			holding <- result{head, err}
		}()
		var res result
		select {
		case res = <-holding:
			releaseOnce()
		case <-time.After(500 * time.Millisecond): // waiting for the replay is one of the two answers
			releaseOnce()
			select {
			case res = <-holding:
			case <-time.After(30 * time.Second):
				t.Fatal("the hold did not return after the replay")
			}
		}
		require.NoError(t, res.err)
		require.Contains(t, []string{"h10", "e20"}, res.head, "held behind the queue")
		select {
		case err := <-replayed:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the replay did not return")
		}
		require.Equal(t, []string{"e20", "e30<-e20"}, queue(t, lot, "q-a"), "the replay made the next entry the head")
		require.Equal(t, map[string]string{"a": "e20"}, heads(t, lot, "q-a"))
	})
}
