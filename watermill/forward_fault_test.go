package watermill_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/watermill/internal/brokertest"
)

// faultSize is the crash tests' size: 5,000 events over 500 aggregates and
// 10 SIGKILLs by default, the 20,000 events with SUBSCRIPTIONS_LONG=1
// (as .ci/run sets), or SUBSCRIPTIONS_FORWARD_EVENTS.
func faultSize(t *testing.T) (events, aggregates, kills int) {
	events, aggregates, kills = 5_000, 500, 10
	if os.Getenv("SUBSCRIPTIONS_LONG") == "1" {
		events = 20_000
	}
	if v := os.Getenv("SUBSCRIPTIONS_FORWARD_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "SUBSCRIPTIONS_FORWARD_EVENTS")
		events = n
	}
	return events, aggregates, kills
}

// faultWriter appends events of random aggregates, one to four at a time,
// from four goroutines (each owning a quarter of the aggregates), until it
// has appended max, and records what it appended.
type faultWriter struct {
	done    chan struct{}
	started time.Time
	took    time.Duration
	mu      sync.Mutex
	ids     []string
	err     error
}

func startFaultWriter(t *testing.T, store domain.EventStore, aggregates, max int) *faultWriter {
	const writers = 4
	w := &faultWriter{done: make(chan struct{}), started: time.Now()}
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			quota := max / writers
			if g == 0 {
				quota += max % writers
			}
			for n := 0; n < quota; {
				agg := fmt.Sprintf("order-%d", g+writers*rand.IntN(aggregates/writers))
				k := min(1+rand.IntN(4), quota-n)
				batch := make([]domain.EventEnvelope[any], k)
				for j := range batch {
					batch[j] = domain.NewEventEnvelope[any](map[string]any{"agg": agg, "n": n + j}, agg, "order.placed", 0)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := store.Append(ctx, agg, -1, batch...)
				cancel()
				w.mu.Lock()
				if err != nil {
					w.err = err
					w.mu.Unlock()
					return
				}
				for _, ev := range batch {
					w.ids = append(w.ids, ev.ID)
				}
				w.mu.Unlock()
				n += k
			}
		})
	}
	go func() {
		wg.Wait()
		w.took = time.Since(w.started)
		close(w.done)
	}()
	t.Cleanup(func() { <-w.done })
	return w
}

// waitCount waits (bounded) until the writer has appended n events or
// finished.
func (w *faultWriter) waitCount(t *testing.T, n int) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		w.mu.Lock()
		got := len(w.ids)
		w.mu.Unlock()
		select {
		case <-w.done:
			return
		default:
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer appended %d of %d events within 2 minutes", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *faultWriter) wait(t *testing.T) []string {
	select {
	case <-w.done:
	case <-time.After(5 * time.Minute):
		t.Fatal("the writer did not finish within 5 minutes")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	require.NoError(t, w.err)
	return w.ids
}

// faultRun is one crash test's setup: a Postgres schema with the event
// store, a broker behind a proxy, and the forwarding child's arguments.
type faultRun struct {
	pg     *dbtest.Postgres
	events domain.EventStore
	proxy  *brokertest.Proxy
	bin    string
	args   []string
	name   string
}

func newFaultRun(t *testing.T, broker, brokerURL, topic string) *faultRun {
	pg := dbtest.NewPostgres(t)
	events, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	_, err = subscriptions.NewGormCheckpointStore(pg.DB)
	require.NoError(t, err)
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	proxy := brokertest.StartProxy(t, u.Host)
	u.Host = proxy.Addr
	r := &faultRun{pg: pg, events: events, proxy: proxy, bin: brokertest.BuildChild(t, "./internal/cmd/forwardchild"), name: "forward"}
	r.args = []string{"-dsn", pg.DSN, "-name", r.name, "-broker", broker, "-url", u.String(), "-topic", topic, "-batch", "200"}
	return r
}

// crashLoop appends the events while the child is SIGKILLed kills times,
// spread over the appends: in odd lives by itself right after the broker
// acknowledged a batch and before its checkpoint commits (the window
// deduplication covers; the life starts on a backlog), in even lives by
// the parent at a random moment, after the proxy has cut the broker
// connection for a while. A last child then catches up and stops. It
// returns the IDs appended.
func (r *faultRun) crashLoop(t *testing.T) []string {
	total, aggregates, kills := faultSize(t)
	w := startFaultWriter(t, r.events, aggregates, total)
	var selfKills, cuts int
	for i := range kills {
		share := total * (i + 1) / (kills + 1)
		if i%2 == 1 {
			w.waitCount(t, share) // a backlog for the self-killing life
		}
		c := brokertest.StartChild(t, r.bin, append(r.args, "-kill-after-acks", strconv.Itoa(map[bool]int{true: 1 + rand.IntN(5), false: 0}[i%2 == 1]))...)
		c.WaitReady(t)
		if i%2 == 1 {
			if c.WaitKilled(t, 30*time.Second) {
				selfKills++
				c.RequireClean(t)
				continue
			}
			t.Logf("life %d: no batch acknowledged within 30s; killing it", i)
		} else {
			w.waitCount(t, share) // forwarding live meanwhile
			time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
			r.proxy.Down(t)
			cuts++
			time.Sleep(time.Duration(100+rand.IntN(500)) * time.Millisecond)
			r.proxy.Up(t)
			time.Sleep(time.Duration(rand.IntN(600)) * time.Millisecond)
		}
		c.Kill(t)
		c.RequireClean(t)
	}
	loop := time.Since(w.started)
	ids := w.wait(t)
	finalStart := time.Now()
	final := brokertest.StartChild(t, r.bin, r.args...)
	final.WaitReady(t)
	sub, err := subscriptions.NewSubscriber(r.name, r.events, mustCheckpoints(t, r.pg.DB), func(context.Context, domain.EventEnvelope[any]) error { return nil })
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err = sub.WaitCaughtUp(ctx) // reads the checkpoint the child commits
	require.NoError(t, err, "the last child did not catch up:\n%s", final.Output())
	final.Term(t)
	final.RequireClean(t)
	t.Logf("%d events of %d aggregates; %d kills (%d right after a broker ack, before the commit), %d connection cuts; kill loop %v, appends %v, last child's catch-up %v",
		len(ids), aggregates, kills, selfKills, cuts, loop.Round(time.Millisecond), w.took.Round(time.Millisecond), time.Since(finalStart).Round(time.Millisecond))
	require.Positive(t, selfKills, "no kill hit the window between the broker's ack and the commit")
	return ids
}

func mustCheckpoints(t *testing.T, db *gorm.DB) subscriptions.CheckpointStore {
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	return cps
}

// TestForwardCrashJetStream: through SIGKILLs of the forwarding process
// (some right after the broker acknowledged a batch, before the
// checkpoint committed) and cuts of its broker connection, a consumer of
// the stream sees every event exactly once (Nats-Msg-Id deduplication
// within the stream's Duplicates window), each aggregate in order.
func TestForwardCrashJetStream(t *testing.T) {
	t.Parallel()
	s := brokertest.NewStream(t, 2*time.Minute)
	r := newFaultRun(t, "nats", brokertest.NATSURL(), s.Subject)
	ids := r.crashLoop(t)

	got := s.ReadAll(t, len(ids))
	seen := make(map[string]int, len(got))
	for _, m := range got {
		seen[m.UUID]++
	}
	var dups, lost int
	for _, n := range seen {
		dups += n - 1
	}
	for _, id := range ids {
		if seen[id] == 0 {
			lost++
		}
	}
	require.Zero(t, dups, "duplicates in the stream")
	require.Zero(t, lost, "events missing from the stream")
	require.Len(t, got, len(ids))
	requireAggregateOrder(t, got)
}

// TestForwardCrashRabbitMQ: the same against RabbitMQ, which has no
// deduplication: nothing is lost, each aggregate's first deliveries come
// in order, and every duplicate carries the UUID of its first delivery
// (the event ID), so a consumer can drop it.
func TestForwardCrashRabbitMQ(t *testing.T) {
	t.Parallel()
	q := brokertest.NewQueue(t)
	r := newFaultRun(t, "amqp", brokertest.AMQPURL(), q.Name)
	ids := r.crashLoop(t)

	got := q.Drain(t, len(ids))
	type key struct{ agg, seq string }
	uuidOf := map[key]string{}
	next := map[string]int{}
	dups := 0
	for _, m := range got {
		k := key{m.AggregateID, m.SequenceNo}
		if u, ok := uuidOf[k]; ok {
			dups++
			require.Equal(t, u, m.UUID, "a duplicate of %s/%s carries another UUID", m.AggregateID, m.SequenceNo)
			continue
		}
		uuidOf[k] = m.UUID
		n, err := strconv.Atoi(m.SequenceNo)
		require.NoError(t, err)
		require.Equal(t, next[m.AggregateID]+1, n, "aggregate %s: first delivery of %d after %d", m.AggregateID, n, next[m.AggregateID])
		next[m.AggregateID] = n
	}
	delivered := map[string]bool{}
	for _, u := range uuidOf {
		delivered[u] = true
	}
	lost := 0
	for _, id := range ids {
		if !delivered[id] {
			lost++
		}
	}
	require.Zero(t, lost, "events missing from the queue")
	require.Len(t, uuidOf, len(ids))
	t.Logf("RabbitMQ: %d messages for %d events: %d duplicates, each with its first delivery's UUID", len(got), len(ids), dups)
	require.Positive(t, dups, "kills after a broker ack made no duplicate: the test did not hit the window")
}
