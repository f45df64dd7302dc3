package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// errOrderFailed is the failure of an order event the tests make fail.
var errOrderFailed = errors.New("order projection: this event fails")

// orderProj is an order projection (placed -> paid -> shipped -> ...):
// per order, the IDs of the events applied to its row, in the order they
// were applied, through the batch transaction on a database backend, in
// memory (once per event) otherwise. A reader (watch) checks, while the
// subscriber runs, that every row is a prefix of its order's events in
// feed order, skipping those discarded: that no handler saw a later event
// of an order before an earlier one.
type orderProj struct {
	e     *env
	table string

	mu        sync.Mutex
	mem       map[string][]string // memory backend: order -> applied IDs
	seen      map[string]bool
	feed      map[string][]string // order -> event IDs in feed order
	discarded map[string]bool
	failing   map[string]bool                         // event IDs whose handler fails
	calls     map[string]int                          // handler calls per event ID
	kinds     map[string][]subscriptions.DeliveryKind // DeliveryFrom of each call, per event ID
	broken    []string                                // what watch saw wrong
}

func newOrderProj(t *testing.T, e *env, table string) *orderProj {
	t.Helper()
	if e.DB != nil {
		require.NoError(t, e.DB.Exec("CREATE TABLE "+table+" (order_id text PRIMARY KEY, history text NOT NULL)").Error)
	}
	return &orderProj{e: e, table: table, mem: map[string][]string{}, seen: map[string]bool{}, feed: map[string][]string{},
		discarded: map[string]bool{}, failing: map[string]bool{}, calls: map[string]int{}, kinds: map[string][]subscriptions.DeliveryKind{}}
}

// add appends an event of order to the feed and returns it as stored.
func (p *orderProj) add(t *testing.T, order, typ string) domain.EventEnvelope[any] {
	t.Helper()
	ctx := context.Background()
	ev := domain.NewEventEnvelope[any](map[string]any{"order": order}, order, "order."+typ, 0)
	p.mu.Lock()
	p.feed[order] = append(p.feed[order], ev.ID)
	p.mu.Unlock()
	require.NoError(t, p.e.Events.Append(ctx, order, -1, ev))
	stored, err := p.e.Events.GetEventByID(ctx, ev.ID)
	require.NoError(t, err)
	return stored
}

// fail makes the handler of these events fail (true) or succeed.
func (p *orderProj) fail(on bool, evs ...domain.EventEnvelope[any]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range evs {
		p.failing[ev.ID] = on
	}
}

// kindsOf is the DeliveryFrom kind of each handler call of id.
func (p *orderProj) kindsOf(id string) []subscriptions.DeliveryKind {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.kinds[id])
}

func (p *orderProj) callsOf(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[id]
}

// discard records that the test is about to discard ev (before it does,
// so that watch never sees the next one early).
func (p *orderProj) discard(ev domain.EventEnvelope[any]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.discarded[ev.ID] = true
}

// handle is the per-event handler.
func (p *orderProj) handle(ctx context.Context, ev domain.EventEnvelope[any]) error {
	p.mu.Lock()
	p.calls[ev.ID]++
	p.kinds[ev.ID] = append(p.kinds[ev.ID], subscriptions.DeliveryFrom(ctx).Kind)
	failing := p.failing[ev.ID]
	p.mu.Unlock()
	if failing {
		return errOrderFailed
	}
	return p.apply(ctx, ev)
}

// handleBatch is the batch handler: every event applied in one call, the
// whole call failing when one of them fails.
func (p *orderProj) handleBatch(ctx context.Context, evs []domain.EventEnvelope[any]) error {
	for _, ev := range evs {
		if err := p.handle(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

func (p *orderProj) apply(ctx context.Context, ev domain.EventEnvelope[any]) error {
	if p.e.DB == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.seen[ev.ID] {
			p.seen[ev.ID] = true
			p.mem[ev.AggregateID] = append(p.mem[ev.AggregateID], ev.ID)
		}
		return nil
	}
	return p.e.Exec(ctx, "INSERT INTO "+p.table+" (order_id, history) VALUES (?, ?) ON CONFLICT (order_id) DO UPDATE SET history = "+
		p.table+".history || ',' || excluded.history", ev.AggregateID, ev.ID)
}

// rows reads the projection: order -> applied event IDs.
func (p *orderProj) rows(t testing.TB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	if p.e.DB == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		for k, v := range p.mem {
			out[k] = slices.Clone(v)
		}
		return out
	}
	var rows []struct{ OrderID, History string }
	require.NoError(t, p.e.DB.Raw("SELECT order_id, history FROM "+p.table).Scan(&rows).Error)
	for _, r := range rows {
		out[r.OrderID] = strings.Split(r.History, ",")
	}
	return out
}

// check records every row that is not a prefix of its order's events in
// feed order (the discarded ones left out).
func (p *orderProj) check(rows map[string][]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for order, got := range rows {
		var want []string
		for _, id := range p.feed[order] {
			if !p.discarded[id] {
				want = append(want, id)
			}
		}
		if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
			p.broken = append(p.broken, fmt.Sprintf("order %s: applied %v, feed order %v", order, got, want))
		}
	}
}

// watch reads the projection every few milliseconds until the test ends,
// and then requires that no read saw an order's events out of order.
func (p *orderProj) watch(t *testing.T) {
	t.Helper()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				p.check(p.rows(t))
			}
		}
	}()
	t.Cleanup(func() {
		close(done)
		<-stopped
		p.check(p.rows(t))
		p.mu.Lock()
		defer p.mu.Unlock()
		require.Empty(t, p.broken, "a reader saw an order's events applied out of order")
	})
}

// requireRow requires that the projection's row of order holds evs.
func (p *orderProj) requireRow(t *testing.T, order string, evs ...domain.EventEnvelope[any]) {
	t.Helper()
	want := make([]string, len(evs))
	for i, ev := range evs {
		want[i] = ev.ID
	}
	require.Eventually(t, func() bool { return slices.Equal(p.rows(t)[order], want) }, 30*time.Second, 5*time.Millisecond,
		"row of %s: want %v, have %v", order, want, p.rows(t)[order])
}

// orderSub is a WithOrderedParking subscriber of the projection that parks
// on the first failure.
func orderSub(t *testing.T, e *env, name string, p *orderProj, opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
	t.Helper()
	return parkSubscriber(t, e, name, p.handle, append([]subscriptions.SubscriberOption{subscriptions.WithParkingLot(e.Parking),
		subscriptions.WithOrderedParking(), subscriptions.WithMaxRetries(0)}, opts...)...)
}

// parkedState lists the subscriber's entries as "id" or "id<-head".
func parkedState(t *testing.T, sub *subscriptions.Subscriber) []string {
	t.Helper()
	parked, err := sub.ListParked(context.Background())
	require.NoError(t, err)
	out := make([]string, len(parked))
	for i, e := range parked {
		out[i] = e.EventID
		if e.HeldBy != "" {
			out[i] += "<-" + e.HeldBy
		}
	}
	return out
}

// waitParkedState waits until the subscriber's entries are want.
func waitParkedState(t *testing.T, sub *subscriptions.Subscriber, want ...string) {
	t.Helper()
	require.Eventually(t, func() bool { return slices.Equal(parkedState(t, sub), want) }, 30*time.Second, 5*time.Millisecond,
		"parked entries: want %v, have %v", want, parkedState(t, sub))
}

func held(ev, head domain.EventEnvelope[any]) string { return ev.ID + "<-" + head.ID }

// TestOrderedParkingKeepsAnOrderInOrder: an order projection (placed ->
// paid -> shipped) whose 'paid' fails. With WithOrderedParking, 'shipped'
// and whatever follows of the order are held behind 'paid' while other
// orders go on, and a reader never sees a row shipped before paid; Status
// counts them; a replay of a held entry is refused; ReplayParked of
// 'paid' replays the queue in order; the order then flows live again.
// Without the option the same feed leaves the row shipped without paid,
// which the reader reports (the default's case below).
func TestOrderedParkingKeepsAnOrderInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			p := newOrderProj(t, e, "order_rows")
			placed1, placed2 := p.add(t, "o1", "placed"), p.add(t, "o2", "placed")
			paid1 := p.add(t, "o1", "paid")
			p.fail(true, paid1)
			paid2, shipped1, shipped2 := p.add(t, "o2", "paid"), p.add(t, "o1", "shipped"), p.add(t, "o2", "shipped")
			p.watch(t)
			sub := orderSub(t, e, "orders", p)
			r := start(t, sub)

			waitParkedState(t, sub, paid1.ID, held(shipped1, paid1))
			p.requireRow(t, "o2", placed2, paid2, shipped2) // other orders go on
			waitCaughtUp(t, sub)
			p.requireRow(t, "o1", placed1)
			require.Zero(t, p.callsOf(shipped1.ID), "no handler saw shipped")
			st, err := sub.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, st.Parked)
			require.Equal(t, 1, st.Held)

			// More of o1 arrives while it is queued: held too.
			delivered1 := p.add(t, "o1", "delivered")
			waitParkedState(t, sub, paid1.ID, held(shipped1, paid1), held(delivered1, paid1))
			got, err := sub.GetParked(ctx, delivered1.ID)
			require.NoError(t, err)
			require.Equal(t, paid1.ID, got.HeldBy)
			require.Zero(t, got.Attempts, "held, never attempted")

			err = sub.ReplayParked(ctx, shipped1.ID)
			require.ErrorIs(t, err, subscriptions.ErrParkedBehindHead)
			require.ErrorContains(t, err, paid1.ID, "the error names the head")
			require.Zero(t, p.callsOf(shipped1.ID))

			p.fail(false, paid1)
			require.NoError(t, sub.ReplayParked(ctx, paid1.ID))
			p.requireRow(t, "o1", placed1, paid1, shipped1, delivered1)
			require.Empty(t, parkedState(t, sub))
			st, err = sub.Status(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Parked)
			require.Zero(t, st.Held)

			returned1 := p.add(t, "o1", "returned")
			p.requireRow(t, "o1", placed1, paid1, shipped1, delivered1, returned1) // live again
			waitCaughtUp(t, sub)
			r.stop(t)
			require.Equal(t, 1, p.callsOf(shipped1.ID), "held events are handled once, by the replay")
			require.Equal(t, 1, p.callsOf(delivered1.ID))
		})
	}

	t.Run("default", func(t *testing.T) {
		t.Parallel()
		e := envBackends()[0].New(t)
		p := newOrderProj(t, e, "order_rows")
		p.add(t, "o1", "placed")
		paid1 := p.add(t, "o1", "paid")
		p.fail(true, paid1)
		shipped1 := p.add(t, "o1", "shipped")
		sub := parkSubscriber(t, e, "orders", p.handle, subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
		r := start(t, sub)
		parkWaitParked(t, sub, 1)
		waitCaughtUp(t, sub)
		r.stop(t)
		require.Equal(t, 1, p.callsOf(shipped1.ID), "without the option shipped is handled on top of a row that missed paid")
		p.check(p.rows(t))
		require.NotEmpty(t, p.broken, "the reader sees it")
	})
}

// TestOrderedParkingReleases: discarding the head makes the next entry
// the head (and the order goes on from it once it is replayed); a replay
// of the queue stops at the first failure, which then heads the queue,
// and ReplayParkedMatching reports what stays held behind it.
func TestOrderedParkingReleases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("discard", func(t *testing.T) {
				e := b.New(t)
				p := newOrderProj(t, e, "order_rows")
				placed := p.add(t, "o1", "placed")
				paid := p.add(t, "o1", "paid")
				p.fail(true, paid)
				shipped, delivered := p.add(t, "o1", "shipped"), p.add(t, "o1", "delivered")
				p.watch(t)
				logger, logs := newLogger()
				sub := orderSub(t, e, "orders", p, subscriptions.WithLogger(logger))
				start(t, sub)
				waitParkedState(t, sub, paid.ID, held(shipped, paid), held(delivered, paid))

				p.discard(paid)
				gone, err := sub.DiscardParked(ctx, paid.ID, "ops")
				require.NoError(t, err)
				require.Empty(t, gone.HeldBy)
				require.Contains(t, logs.String(), "parked event discarded")
				waitParkedState(t, sub, shipped.ID, held(delivered, shipped))
				require.Zero(t, p.callsOf(shipped.ID), "released, not replayed: the operator decides")
				more := p.add(t, "o1", "returned")
				waitParkedState(t, sub, shipped.ID, held(delivered, shipped), held(more, shipped))

				require.NoError(t, sub.ReplayParked(ctx, shipped.ID))
				p.requireRow(t, "o1", placed, shipped, delivered, more)
				require.Empty(t, parkedState(t, sub))
				live := []subscriptions.DeliveryKind{subscriptions.DeliveryLive}
				for _, ev := range []domain.EventEnvelope[any]{shipped, delivered, more} {
					require.Equal(t, live, p.kindsOf(ev.ID), "only ever held: its first delivery is live")
				}
			})
			t.Run("replay stops at a failure", func(t *testing.T) {
				e := b.New(t)
				p := newOrderProj(t, e, "order_rows")
				placed := p.add(t, "o1", "placed")
				paid := p.add(t, "o1", "paid")
				p.fail(true, paid)
				shipped, delivered := p.add(t, "o1", "shipped"), p.add(t, "o1", "delivered")
				other := p.add(t, "o2", "placed")
				p.watch(t)
				sub := orderSub(t, e, "orders", p)
				start(t, sub)
				waitParkedState(t, sub, paid.ID, held(shipped, paid), held(delivered, paid))
				p.requireRow(t, "o2", other)

				p.fail(false, paid)
				p.fail(true, shipped)
				err := sub.ReplayParked(ctx, paid.ID)
				require.ErrorIs(t, err, errOrderFailed, "the queue's failure")
				p.requireRow(t, "o1", placed, paid)
				waitParkedState(t, sub, shipped.ID, held(delivered, shipped))
				head, err := sub.GetParked(ctx, shipped.ID)
				require.NoError(t, err)
				require.Equal(t, 1, head.Attempts, "its replay counted")
				require.Contains(t, head.Error, errOrderFailed.Error())

				res, err := sub.ReplayParkedMatching(ctx, subscriptions.ParkedFilter{}, true)
				require.ErrorIs(t, err, errOrderFailed)
				require.Empty(t, res.Replayed)
				require.Equal(t, []subscriptions.ParkedReplayFailure{{EventID: shipped.ID, Position: shipped.Position, Error: res.Failed[0].Error}}, res.Failed)
				require.Equal(t, []string{delivered.ID}, res.Held, "not tried: behind the failing head")
				require.Equal(t, 2, p.callsOf(shipped.ID), "tried by each replay")
				require.Zero(t, p.callsOf(delivered.ID), "never handled while shipped fails")

				p.fail(false, shipped)
				res, err = sub.ReplayParkedMatching(ctx, subscriptions.ParkedFilter{AggregateID: "o1"}, false)
				require.NoError(t, err)
				require.Equal(t, []string{shipped.ID, delivered.ID}, res.Replayed, "the head and its queue")
				require.Empty(t, res.Held)
				p.requireRow(t, "o1", placed, paid, shipped, delivered)
				require.Empty(t, parkedState(t, sub))
				replay := subscriptions.DeliveryParkedReplay
				require.Equal(t, replay, p.kindsOf(paid.ID)[len(p.kindsOf(paid.ID))-1], "parked for its own failure")
				require.Equal(t, []subscriptions.DeliveryKind{subscriptions.DeliveryLive, replay, replay}, p.kindsOf(shipped.ID),
					"released live, then replayed after its own failure")
				require.Equal(t, []subscriptions.DeliveryKind{subscriptions.DeliveryLive}, p.kindsOf(delivered.ID))
			})
		})
	}
}

// TestOrderedParkingAcrossRuns: a queue outlives its subscriber: a new
// process (new stores on the database) holds the order's next event
// behind it too, and replicas of the name, each looking the queues up
// when it takes over, never hand an order's later event to a handler
// while an earlier one is parked.
func TestOrderedParkingAcrossRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("restart", func(t *testing.T) {
				e := b.New(t)
				p := newOrderProj(t, e, "order_rows")
				placed := p.add(t, "o1", "placed")
				paid := p.add(t, "o1", "paid")
				p.fail(true, paid)
				shipped := p.add(t, "o1", "shipped")
				p.watch(t)
				sub := orderSub(t, e, "orders", p)
				r := start(t, sub)
				waitParkedState(t, sub, paid.ID, held(shipped, paid))
				waitCaughtUp(t, sub)
				r.stop(t)

				events, cps := e.reopen(t)
				again := &env{Name: e.Name, DB: e.DB, PG: e.PG, Pgx: e.Pgx, Events: events, Checkpoints: cps, Parking: e.Parking}
				sub2 := orderSub(t, again, "orders", p)
				start(t, sub2)
				delivered := p.add(t, "o1", "delivered")
				waitParkedState(t, sub2, paid.ID, held(shipped, paid), held(delivered, paid))
				p.fail(false, paid)
				require.NoError(t, sub2.ReplayParked(ctx, paid.ID))
				p.requireRow(t, "o1", placed, paid, shipped, delivered)
			})
			t.Run("replicas", func(t *testing.T) {
				if !b.Postgres {
					t.Skip("SQLite is for one process")
				}
				e := b.New(t)
				p := newOrderProj(t, e, "order_rows")
				var orders []string
				for i := range 6 {
					orders = append(orders, fmt.Sprintf("o%d", i))
				}
				first := map[string]domain.EventEnvelope[any]{}
				for _, o := range orders {
					first[o] = p.add(t, o, "placed")
				}
				paid := p.add(t, "o0", "paid")
				p.fail(true, paid)
				p.watch(t)
				var subs []*subscriptions.Subscriber
				for range 3 {
					events, cps := e.reopen(t)
					replica := &env{Name: e.Name, DB: e.DB, PG: e.PG, Pgx: e.Pgx, Events: events, Checkpoints: cps, Parking: e.Parking}
					sub := orderSub(t, replica, "orders", p)
					subs = append(subs, sub)
					start(t, sub)
				}
				waitParkedState(t, subs[0], paid.ID)
				// The order's later events, and everyone else's, arrive in
				// rounds; whichever replica takes each batch holds o0's.
				var later []string
				for round := range 5 {
					for _, o := range orders {
						ev := p.add(t, o, fmt.Sprintf("step%d", round))
						if o == "o0" {
							later = append(later, held(ev, paid))
						}
					}
				}
				waitParkedState(t, subs[1], append([]string{paid.ID}, later...)...)
				waitCaughtUp(t, subs[2])
				for _, o := range orders[1:] {
					require.Len(t, p.rows(t)[o], 6, "order %s went on", o)
				}
				p.fail(false, paid)
				require.NoError(t, subs[2].ReplayParked(ctx, paid.ID))
				require.Eventually(t, func() bool { return len(p.rows(t)["o0"]) == 7 }, 30*time.Second, 5*time.Millisecond)
				require.Empty(t, parkedState(t, subs[0]))
			})
		})
	}
}

// TestOrderedParkingPartitionsAndBatches: with partitions (several at
// once) and with a batch handler, the order's later events are held and
// never reach a handler, other orders go on in every partition, and the
// replay releases the queue in order.
func TestOrderedParkingPartitionsAndBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	variants := []struct {
		name string
		opts func(p *orderProj) []subscriptions.SubscriberOption
		nil  bool // a nil Handler (WithBatchHandler)
	}{
		{"partitions", func(*orderProj) []subscriptions.SubscriberOption {
			return []subscriptions.SubscriberOption{subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2)}
		}, false},
		{"batch handler", func(p *orderProj) []subscriptions.SubscriberOption {
			return []subscriptions.SubscriberOption{subscriptions.WithBatchHandler(p.handleBatch)}
		}, true},
		{"partitioned batch handler", func(p *orderProj) []subscriptions.SubscriberOption {
			return []subscriptions.SubscriberOption{subscriptions.WithBatchHandler(p.handleBatch), subscriptions.WithPartitions(3)}
		}, true},
	}
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					e := b.New(t)
					p := newOrderProj(t, e, "order_rows")
					const orders = 8
					want := map[string][]domain.EventEnvelope[any]{}
					add := func(o, typ string) domain.EventEnvelope[any] {
						ev := p.add(t, o, typ)
						want[o] = append(want[o], ev)
						return ev
					}
					for i := range orders {
						add(fmt.Sprintf("o%d", i), "placed")
					}
					paid := add("o3", "paid")
					p.fail(true, paid)
					var queued []string
					for _, typ := range []string{"shipped", "delivered"} {
						for i := range orders {
							ev := add(fmt.Sprintf("o%d", i), typ)
							if i == 3 {
								queued = append(queued, held(ev, paid))
							}
						}
					}
					p.watch(t)
					h := subscriptions.Handler(p.handle)
					if v.nil {
						h = nil
					}
					sub := parkSubscriber(t, e, "orders", h, append([]subscriptions.SubscriberOption{subscriptions.WithParkingLot(e.Parking),
						subscriptions.WithOrderedParking(), subscriptions.WithMaxRetries(0), subscriptions.WithBatchSize(5)}, v.opts(p)...)...)
					start(t, sub)
					waitParkedState(t, sub, append([]string{paid.ID}, queued...)...)
					waitCaughtUp(t, sub)
					for i := range orders {
						if o := fmt.Sprintf("o%d", i); o != "o3" {
							p.requireRow(t, o, want[o]...)
						}
					}
					p.requireRow(t, "o3", want["o3"][0])
					st, err := sub.Status(ctx)
					require.NoError(t, err)
					require.Equal(t, 2, st.Held)

					p.fail(false, paid)
					require.NoError(t, sub.ReplayParked(ctx, paid.ID))
					p.requireRow(t, "o3", want["o3"]...)
					require.Empty(t, parkedState(t, sub))
				})
			}
		})
	}
}

// TestOrderedParkingAfterReset: a reset behind a parked head delivers the
// head again, as today's parked-entry rules say: until then a replay is
// refused (ErrParkedAfterCheckpoint); a success releases the queue, whose
// events are then handled live in order, and the entries go; a failure
// parks the head again and holds the rest again.
func TestOrderedParkingAfterReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			p := newOrderProj(t, e, "order_rows")
			placed := p.add(t, "o1", "placed")
			paid := p.add(t, "o1", "paid")
			p.fail(true, paid)
			shipped, other := p.add(t, "o1", "shipped"), p.add(t, "o2", "placed")
			sub := orderSub(t, e, "orders", p)
			r := start(t, sub)
			waitParkedState(t, sub, paid.ID, held(shipped, paid))
			waitCaughtUp(t, sub)
			r.stop(t)

			// Fails again after the reset: parked and held again.
			require.NoError(t, sub.ResetCheckpoint(ctx, 0))
			require.ErrorIs(t, sub.ReplayParked(ctx, paid.ID), subscriptions.ErrParkedAfterCheckpoint)
			calls := p.callsOf(paid.ID)
			r = start(t, sub)
			waitCaughtUp(t, sub)
			require.Greater(t, p.callsOf(paid.ID), calls, "delivered again")
			require.Equal(t, []string{paid.ID, held(shipped, paid)}, parkedState(t, sub))
			require.Zero(t, p.callsOf(shipped.ID))
			r.stop(t)

			// Succeeds after the reset, which empties the projection in its
			// transaction: the queue is released and handled in order.
			p.fail(false, paid)
			if e.DB != nil {
				require.NoError(t, sub.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
					return e.Exec(ctx, "DELETE FROM order_rows")
				}))
			} else {
				p.mu.Lock()
				p.mem, p.seen = map[string][]string{}, map[string]bool{}
				p.mu.Unlock()
				require.NoError(t, sub.ResetCheckpoint(ctx, 0))
			}
			p.watch(t)
			start(t, sub)
			p.requireRow(t, "o1", placed, paid, shipped)
			p.requireRow(t, "o2", other)
			waitCaughtUp(t, sub)
			require.Empty(t, parkedState(t, sub), "the delivered entries went")
		})
	}
}

// TestOrderedParkingNeedsAnOrderedLot: WithOrderedParking without a
// parking lot, or with one that cannot keep queues, is refused by
// NewSubscriber, naming the lot.
func TestOrderedParkingNeedsAnOrderedLot(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	h := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	_, err := subscriptions.NewSubscriber("orders", e.Events, e.Checkpoints, h, subscriptions.WithOrderedParking())
	require.ErrorContains(t, err, "WithParkingLot")
	_, err = subscriptions.NewSubscriber("orders", e.Events, e.Checkpoints, h, subscriptions.WithOrderedParking(),
		subscriptions.WithParkingLot(plainLot{e.Parking}))
	require.ErrorContains(t, err, "OrderedParkingLot")
	_, err = subscriptions.NewSubscriber("orders", e.Events, e.Checkpoints, h, subscriptions.WithOrderedParking(),
		subscriptions.WithParkingLot(e.Parking))
	require.NoError(t, err)
}
