package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// partProjection is a projection that counts each event's handling and
// checks per-aggregate order: each event carries its aggregate's sequence
// number n (0, 1, ...), and the handler requires the aggregate's last
// projected n to be n-1. On a database it writes through the batch
// transaction, so only committed batches count; on the memory backend
// (no transaction, and no rollback in these tests) it writes to a map.
type partProjection struct {
	e     *env
	db    *gorm.DB // nil: memory
	table string

	mu         sync.Mutex
	counts     map[string]int
	last       map[string]int
	violations []string
}

func newPartProjection(t *testing.T, e *env, prefix string) *partProjection {
	t.Helper()
	p := &partProjection{e: e, db: e.DB, table: prefix, counts: map[string]int{}, last: map[string]int{}}
	if e.DB != nil {
		require.NoError(t, e.DB.Exec(fmt.Sprintf("CREATE TABLE %s (event_id TEXT PRIMARY KEY, agg TEXT NOT NULL, n INTEGER NOT NULL, handled INTEGER NOT NULL)", prefix)).Error)
	}
	return p
}

// handler projects ev; order checks only apply while strict is set (a
// reset replays events whose successors are already projected).
func (p *partProjection) handler(strict bool) subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		var n int
		switch v := ev.Payload.(map[string]any)["n"].(type) {
		case int:
			n = v // the memory store keeps payloads as appended
		case float64:
			n = int(v) // the GORM store decodes JSON numbers
		}
		if p.db == nil {
			p.mu.Lock()
			defer p.mu.Unlock()
			prev, seen := p.last[ev.AggregateID]
			if strict && ((!seen && n != 0) || (seen && prev != n-1)) {
				p.violations = append(p.violations, fmt.Sprintf("%s: %d after %d", ev.AggregateID, n, prev))
			}
			p.last[ev.AggregateID] = n
			p.counts[ev.ID]++
			return nil
		}
		if strict {
			var prev int
			if err := p.e.QueryRow(ctx, fmt.Sprintf("SELECT COALESCE(MAX(n), -1) FROM %s WHERE agg = ?", p.table), ev.AggregateID).Scan(&prev); err != nil {
				return err
			}
			if prev != n-1 {
				p.mu.Lock()
				p.violations = append(p.violations, fmt.Sprintf("%s: %d after %d", ev.AggregateID, n, prev))
				p.mu.Unlock()
			}
		}
		return p.e.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (event_id, agg, n, handled) VALUES (?, ?, ?, 1)
			ON CONFLICT (event_id) DO UPDATE SET handled = %s.handled + 1`, p.table, p.table), ev.ID, ev.AggregateID, n)
	}
}

// handled returns how many committed handlings each event got.
func (p *partProjection) handled(t *testing.T) map[string]int {
	t.Helper()
	if p.db == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		out := make(map[string]int, len(p.counts))
		for k, v := range p.counts {
			out[k] = v
		}
		return out
	}
	var rows []struct {
		EventID string
		Handled int
	}
	require.NoError(t, p.db.Raw(fmt.Sprintf("SELECT event_id, handled FROM %s", p.table)).Scan(&rows).Error)
	out := make(map[string]int, len(rows))
	for _, r := range rows {
		out[r.EventID] = r.Handled
	}
	return out
}

func (p *partProjection) orderViolations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.violations...)
}

// partAppend appends count events round-robin over aggs aggregates, each
// with its aggregate's sequence number n; seq carries the numbering across
// calls. It returns the events' IDs with their aggregates.
func partAppend(t *testing.T, store domain.EventStore, seq map[string]int, aggs, count int) []domain.EventEnvelope[any] {
	t.Helper()
	out := make([]domain.EventEnvelope[any], 0, count)
	for i := 0; i < count; i++ {
		agg := fmt.Sprintf("part-agg-%d", i%aggs)
		ev := domain.NewEventEnvelope[any](map[string]any{"n": seq[agg]}, agg, "part.event", 0)
		seq[agg]++
		require.NoError(t, store.Append(context.Background(), agg, -1, ev))
		out = append(out, ev)
	}
	return out
}

// partReplica is one replica's stores: on Postgres its own pool, as a
// separate process would have; elsewhere the env's own (one process).
func partReplica(t *testing.T, e *env) (domain.EventStore, subscriptions.CheckpointStore, subscriptions.ParkingLot) {
	t.Helper()
	if !e.Postgres() {
		return e.Events, e.Checkpoints, e.Parking
	}
	if e.Pgx != nil {
		ctx := context.Background()
		pool := e.PG.OpenPgx(t)
		events, err := pgxstore.NewEventStore(ctx, pool)
		require.NoError(t, err)
		cps, err := pgxstore.NewCheckpointStore(ctx, pool)
		require.NoError(t, err)
		lot, err := pgxstore.NewParkingLot(ctx, pool)
		require.NoError(t, err)
		return events, cps, lot
	}
	db := e.PG.Open(t)
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	lot, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)
	return events, cps, lot
}

// TestPartitionOfIsStable pins the hash: these values are a
// compatibility promise (changing them moves aggregates between
// partitions of running subscribers).
func TestPartitionOfIsStable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		agg  string
		n    int
		want int
	}{
		{"acc-1", 8, 4227328594 % 8},
		{"acc-1", 1, 0},
		{"", 16, 0xd41d8cd9 % 16},
		{"acc-1", 0, 0},
	} {
		require.Equal(t, c.want, subscriptions.PartitionOf(c.agg, c.n), "PartitionOf(%q, %d)", c.agg, c.n)
	}
}

// TestPartitionOptionsAreValidated: out-of-range partition options are
// refused at construction.
func TestPartitionOptionsAreValidated(t *testing.T) {
	t.Parallel()
	events, cps := infrastructure.NewMemoryStore(), subscriptions.NewMemoryCheckpointStore()
	h := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	for _, c := range []struct {
		name string
		opts []subscriptions.SubscriberOption
		want string
	}{
		{"zero partitions", []subscriptions.SubscriberOption{subscriptions.WithPartitions(-1)}, "WithPartitions"},
		{"too many partitions", []subscriptions.SubscriberOption{subscriptions.WithPartitions(subscriptions.MaxPartitions + 1)}, "WithPartitions"},
		{"concurrency without partitions", []subscriptions.SubscriberOption{subscriptions.WithConcurrency(2)}, "needs partitions"},
		{"concurrency above partitions", []subscriptions.SubscriberOption{subscriptions.WithPartitions(2), subscriptions.WithConcurrency(3)}, "exceeds"},
		{"negative concurrency", []subscriptions.SubscriberOption{subscriptions.WithPartitions(2), subscriptions.WithConcurrency(-1)}, "WithConcurrency"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := subscriptions.NewSubscriber("opts", events, cps, h, c.opts...)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// TestPartitionsSuite runs the partitioned subscriber's behaviour against
// every backend.
func TestPartitionsSuite(t *testing.T) {
	t.Parallel()
	const poll = 20 * time.Millisecond
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("replicas handle every event once, in order per aggregate", func(t *testing.T) {
				e := b.New(t)
				proj := newPartProjection(t, e, "part_replicas")
				seq := map[string]int{}
				want := partAppend(t, e.Events, seq, 24, 150) // a backlog
				const name = "part-replicas"
				var subs []*subscriptions.Subscriber
				var runs []*running
				for i := 0; i < 3; i++ {
					events, cps, _ := partReplica(t, e)
					sub := coreNewSub(t, name, events, cps, proj.handler(true),
						subscriptions.WithPartitions(8), subscriptions.WithConcurrency(2),
						subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(poll))
					subs = append(subs, sub)
					runs = append(runs, start(t, sub))
				}
				want = append(want, partAppend(t, e.Events, seq, 24, 150)...) // live
				// A replica stops mid-way; the others take its partitions.
				runs[0].stop(t)
				want = append(want, partAppend(t, e.Events, seq, 24, 60)...)
				waitCaughtUp(t, subs[1])

				handled := proj.handled(t)
				require.Len(t, handled, len(want))
				for _, ev := range want {
					require.Equal(t, 1, handled[ev.ID], "event %s (%s) handled %d times", ev.ID, ev.AggregateID, handled[ev.ID])
				}
				require.Empty(t, proj.orderViolations())
				lags, err := subs[2].PartitionLags(context.Background())
				require.NoError(t, err)
				require.Equal(t, make([]int64, 8), lags)
			})

			t.Run("reset while partitions run moves every partition", func(t *testing.T) {
				e := b.New(t)
				proj := newPartProjection(t, e, "part_reset")
				seq := map[string]int{}
				want := partAppend(t, e.Events, seq, 16, 300)
				gate := make(chan struct{})
				var once sync.Once
				started := make(chan struct{})
				handler := proj.handler(false)
				sub := coreNewSub(t, "part-reset", e.Events, e.Checkpoints, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					once.Do(func() { close(started) })
					<-gate
					return handler(ctx, ev)
				}, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(4),
					subscriptions.WithBatchSize(5), subscriptions.WithPollInterval(poll))
				run := start(t, sub)
				<-started
				close(gate)
				// Reset to 0 once some batches have committed, while the others run.
				require.Eventually(t, func() bool { return len(proj.handled(t)) >= 40 }, 30*time.Second, time.Millisecond)
				var resetErr error
				require.Eventually(t, func() bool {
					resetErr = sub.ResetCheckpoint(context.Background(), 0)
					// The memory store refuses while a batch is in flight.
					return !errors.Is(resetErr, subscriptions.ErrBatchInFlight)
				}, 30*time.Second, time.Millisecond)
				require.NoError(t, resetErr)
				waitCaughtUp(t, sub)
				run.stop(t)

				handled := proj.handled(t)
				twice := 0
				for _, ev := range want {
					require.Contains(t, []int{1, 2}, handled[ev.ID], "event %s", ev.ID)
					if handled[ev.ID] == 2 {
						twice++
					}
				}
				require.Positive(t, twice, "the reset replayed nothing")
				// Per partition, the events handled before the reset (twice)
				// come before those handled only after it: a batch either
				// committed before the reset or started after it.
				byPart := map[int][]int{}
				for _, ev := range want {
					p := subscriptions.PartitionOf(ev.AggregateID, 4)
					byPart[p] = append(byPart[p], handled[ev.ID])
				}
				for p, counts := range byPart {
					for i := 1; i < len(counts); i++ {
						require.LessOrEqual(t, counts[i], counts[i-1], "partition %d: %v", p, counts)
					}
				}
			})

			t.Run("reset with cleanup while partitions run, wait caught up, delete state", func(t *testing.T) {
				e := b.New(t)
				proj := newPartProjection(t, e, "part_rebuild")
				seq := map[string]int{}
				want := partAppend(t, e.Events, seq, 16, 200)
				sub := coreNewSub(t, "part-rebuild", e.Events, e.Checkpoints, proj.handler(true),
					subscriptions.WithPartitions(4), subscriptions.WithConcurrency(4), subscriptions.WithParkingLot(e.Parking),
					subscriptions.WithBatchSize(5), subscriptions.WithPollInterval(poll))
				run := start(t, sub)
				require.Eventually(t, func() bool { return len(proj.handled(t)) >= 40 }, 30*time.Second, time.Millisecond)
				// The rebuild empties the projection and moves every partition
				// to 0 at once: afterwards each event is projected once, in
				// order per aggregate (the handler checks it).
				require.NoError(t, sub.ResetCheckpointWith(context.Background(), 0, func(ctx context.Context) error {
					if e.DB != nil {
						return e.Exec(ctx, "DELETE FROM part_rebuild")
					}
					proj.mu.Lock()
					defer proj.mu.Unlock()
					proj.counts, proj.last = map[string]int{}, map[string]int{}
					return nil
				}))
				want = append(want, partAppend(t, e.Events, seq, 16, 40)...)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				head, err := sub.WaitCaughtUp(ctx)
				require.NoError(t, err)
				feed := coreFeed(t, e.Events)
				require.Equal(t, feed[len(feed)-1].Position, head)
				handled := proj.handled(t)
				require.Len(t, handled, len(want))
				for _, ev := range want {
					require.Equal(t, 1, handled[ev.ID], "event %s", ev.ID)
				}
				require.Empty(t, proj.orderViolations())

				run.stop(t)
				require.NoError(t, sub.DeleteState(context.Background()))
				lags, err := sub.PartitionLags(context.Background())
				require.NoError(t, err)
				var total int64
				for _, l := range lags {
					total += l
				}
				require.Equal(t, int64(len(want)), total, "every partition starts again at 0")
				// The partition count is forgotten too: another n may run.
				other := coreNewSub(t, "part-rebuild", e.Events, e.Checkpoints, func(context.Context, domain.EventEnvelope[any]) error { return nil },
					subscriptions.WithPartitions(2), subscriptions.WithPollInterval(poll))
				start(t, other)
				waitCaughtUp(t, other)
			})

			t.Run("status counts the events not yet handled", func(t *testing.T) {
				e := b.New(t)
				want := partAppend(t, e.Events, map[string]int{}, 12, 60)
				sub := coreNewSub(t, "part-status", e.Events, e.Checkpoints, func(context.Context, domain.EventEnvelope[any]) error { return nil },
					subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2), subscriptions.WithPollInterval(poll))
				st, err := sub.Status(context.Background())
				require.NoError(t, err)
				require.Equal(t, int64(len(want)), st.Lag)
				require.Zero(t, st.Position)
				require.Positive(t, st.LagSeconds)
				start(t, sub)
				waitCaughtUp(t, sub)
				st, err = sub.Status(context.Background())
				require.NoError(t, err)
				require.Zero(t, st.Lag)
				require.Equal(t, st.Head, st.Position)
			})

			t.Run("another partition count is refused", func(t *testing.T) {
				e := b.New(t)
				h := func(context.Context, domain.EventEnvelope[any]) error { return nil }
				partAppend(t, e.Events, map[string]int{}, 4, 10)
				sub := coreNewSub(t, "part-count", e.Events, e.Checkpoints, h, subscriptions.WithPartitions(4))
				run := start(t, sub)
				waitCaughtUp(t, sub)
				run.stop(t)
				other := coreNewSub(t, "part-count", e.Events, e.Checkpoints, h, subscriptions.WithPartitions(8))
				res := start(t, other).wait(t)
				require.ErrorIs(t, res.err, subscriptions.ErrPartitionsChanged)
				require.ErrorContains(t, res.err, "WithPartitions(4)")
			})

			t.Run("an unpartitioned checkpoint seeds the partitions", func(t *testing.T) {
				e := b.New(t)
				proj := newPartProjection(t, e, "part_seed")
				seq := map[string]int{}
				first := partAppend(t, e.Events, seq, 6, 30)
				plain := coreNewSub(t, "part-seed", e.Events, e.Checkpoints, proj.handler(true))
				run := start(t, plain)
				waitCaughtUp(t, plain)
				run.stop(t)
				more := partAppend(t, e.Events, seq, 6, 30)
				parted := coreNewSub(t, "part-seed", e.Events, e.Checkpoints, proj.handler(true),
					subscriptions.WithPartitions(3), subscriptions.WithConcurrency(3), subscriptions.WithPollInterval(poll))
				start(t, parted)
				waitCaughtUp(t, parted)
				handled := proj.handled(t)
				for _, ev := range append(first, more...) {
					require.Equal(t, 1, handled[ev.ID], "event %s", ev.ID)
				}
				require.Empty(t, proj.orderViolations())
			})

			t.Run("a poison event parks in its partition; the others flow", func(t *testing.T) {
				e := b.New(t)
				seq := map[string]int{}
				evs := partAppend(t, e.Events, seq, 8, 40)
				poison := evs[13]
				var mu sync.Mutex
				seen := map[string]int{}
				fixed := false
				sub := coreNewSub(t, "part-poison", e.Events, e.Checkpoints, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					mu.Lock()
					broken := !fixed
					mu.Unlock()
					if ev.ID == poison.ID && broken {
						return errors.New("poison")
					}
					mu.Lock()
					seen[ev.ID]++
					mu.Unlock()
					return nil
				}, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2), subscriptions.WithParkingLot(e.Parking),
					subscriptions.WithMaxRetries(1), subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond),
					subscriptions.WithPollInterval(poll))
				start(t, sub)
				waitCaughtUp(t, sub)
				parked, err := sub.ListParked(context.Background())
				require.NoError(t, err)
				require.Len(t, parked, 1)
				require.Equal(t, poison.ID, parked[0].EventID)
				require.Equal(t, "part-poison", parked[0].Subscriber)
				mu.Lock()
				require.Len(t, seen, len(evs)-1)
				fixed = true
				mu.Unlock()
				// The replay checks the poison event's partition's checkpoint.
				require.NoError(t, sub.ReplayParked(context.Background(), poison.ID))
				parked, err = sub.ListParked(context.Background())
				require.NoError(t, err)
				require.Empty(t, parked)
				mu.Lock()
				require.Len(t, seen, len(evs))
				mu.Unlock()
			})
		})
	}
}

// TestPartitionsIdleCostDoesNotGrowWithN: on Postgres an idle partitioned
// subscriber costs two statements per poll interval (the feed past the
// last position seen, every partition's checkpoint), whatever n, and opens
// no transaction.
func TestPartitionsIdleCostDoesNotGrowWithN(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	counter := &coreCounter{}
	db := coreCountingDB(t, pg, counter)
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	partAppend(t, events, map[string]int{}, 40, 80)

	const name = "part-idle"
	sub := coreNewSub(t, name, events, cps, func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithPartitions(16), subscriptions.WithConcurrency(4), subscriptions.WithPollInterval(20*time.Millisecond))
	run := start(t, sub)
	waitCaughtUp(t, sub)
	// Let the partitions settle (the first sweep after catching up may
	// look at some again), then count.
	sweeps := func() int {
		stmts, _ := counter.snapshot()
		n := 0
		for _, s := range stmts {
			if strings.Contains(s, "subscriber_checkpoints") {
				n++
			}
		}
		return n
	}
	counter.reset()
	require.Eventually(t, func() bool { return sweeps() >= 3 }, 30*time.Second, 5*time.Millisecond)
	counter.reset()
	require.Eventually(t, func() bool { return sweeps() >= 10 }, 30*time.Second, 5*time.Millisecond)
	run.stop(t)

	stmts, begins := counter.snapshot()
	n := sweeps()
	t.Logf("%d idle polls of 16 partitions: %d statements, %d transactions", n, len(stmts), begins)
	require.Zero(t, begins, "an idle poll must not open a transaction: %q", stmts)
	require.LessOrEqual(t, len(stmts), 2*n+1, "more than 2 statements per idle poll: %q", stmts)
}

// TestPartitionsWakeSignalWakesTheWorkers: with a poll interval far longer
// than the test, events appended after the start are handled because the
// wake signal triggers the coordinator's probe.
func TestPartitionsWakeSignalWakesTheWorkers(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			notifier := subscriptions.NewInProcessNotifier()
			store := subscriptions.NewNotifyingEventStore(e.Events, notifier.Notify)
			proj := newPartProjection(t, e, "part_wake")
			seq := map[string]int{}
			sub := coreNewSub(t, "part-wake", store, e.Checkpoints, proj.handler(true),
				subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2),
				subscriptions.WithPollInterval(time.Hour), subscriptions.WithWakeSignal(notifier.Subscribe()))
			start(t, sub)
			want := partAppend(t, store, seq, 8, 40)
			require.Eventually(t, func() bool { return len(proj.handled(t)) == len(want) }, 30*time.Second, 5*time.Millisecond)
			require.Empty(t, proj.orderViolations())
		})
	}
}

// TestPartitionsHandlerPanicPropagates: a handler panic on a worker
// goroutine ends Run with the same panic on Run's goroutine, after the
// other workers have stopped.
func TestPartitionsHandlerPanicPropagates(t *testing.T) {
	t.Parallel()
	events, cps := infrastructure.NewMemoryStore(), subscriptions.NewMemoryCheckpointStore()
	partAppend(t, events, map[string]int{}, 8, 20)
	sub := coreNewSub(t, "part-panic", events, cps, func(context.Context, domain.EventEnvelope[any]) error {
		panic("boom")
	}, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(4))
	res := start(t, sub).wait(t)
	require.True(t, res.panicked)
	require.Equal(t, "boom", res.panicVal)
}

// TestPartitionParkedEntryRemovedOnLiveDelivery: after a reset of a
// partitioned name, a parked event that its partition delivers again and
// handles removes its entry in the batch transaction, as an unpartitioned
// subscriber's does (TestParkedEntryDoesNotOutliveRedelivery), with a
// Handler and with a BatchHandler. A partition's batches span positions of
// other partitions' events: they must leave those partitions' entries
// alone, so the entry of a parked event whose partition has not got past
// it yet stays listed while the other partitions have committed well past
// its position.
func TestPartitionParkedEntryRemovedOnLiveDelivery(t *testing.T) {
	t.Parallel()
	const (
		poll  = 20 * time.Millisecond
		parts = 4
	)
	ctx := context.Background()
	for _, b := range envBackends() {
		for _, batched := range []bool{false, true} {
			name := b.Name + "/handler"
			if batched {
				name = b.Name + "/batch handler"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := b.New(t)
				proj := newPartProjection(t, e, "part_unpark")
				lenient, strict := proj.handler(false), proj.handler(true)
				evs := partAppend(t, e.Events, map[string]int{}, 8, 64)
				// Two poison events early in the feed, in different
				// partitions; A's partition has events past B.
				poisonA := evs[1]
				pa := subscriptions.PartitionOf(poisonA.AggregateID, parts)
				var poisonB domain.EventEnvelope[any]
				for _, ev := range evs[2:] {
					if subscriptions.PartitionOf(ev.AggregateID, parts) != pa {
						poisonB = ev
						break
					}
				}
				require.NotEmpty(t, poisonB.ID, "every aggregate in one partition")
				stored := coreFeed(t, e.Events)
				posB := stored[slices.IndexFunc(stored, func(ev domain.EventEnvelope[any]) bool { return ev.ID == poisonB.ID })].Position
				require.True(t, slices.ContainsFunc(stored, func(ev domain.EventEnvelope[any]) bool {
					return ev.Position > posB && subscriptions.PartitionOf(ev.AggregateID, parts) == pa
				}), "partition %d has no event past position %d", pa, posB)

				// Phase 0 parks both. After the reset, A succeeds and B fails
				// (and is retried, its partition staying at it, no lock held
				// between attempts) until held is cleared.
				var afterReset, held atomic.Bool
				held.Store(true)
				retriedB := make(chan struct{})
				var retriedOnce sync.Once
				do := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					if !afterReset.Load() {
						if ev.ID == poisonA.ID || ev.ID == poisonB.ID {
							return errors.New("poison")
						}
						return lenient(ctx, ev)
					}
					if ev.ID == poisonB.ID && held.Load() {
						retriedOnce.Do(func() { close(retriedB) })
						return errors.New("still held")
					}
					return strict(ctx, ev)
				}
				newSub := func(opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
					opts = append([]subscriptions.SubscriberOption{subscriptions.WithPartitions(parts), subscriptions.WithConcurrency(parts),
						subscriptions.WithParkingLot(e.Parking), subscriptions.WithBatchSize(5), subscriptions.WithPollInterval(poll)}, opts...)
					var h subscriptions.Handler = do
					if batched {
						h = nil
						opts = append(opts, subscriptions.WithBatchHandler(func(ctx context.Context, events []domain.EventEnvelope[any]) error {
							for _, ev := range events {
								if err := do(ctx, ev); err != nil {
									return err
								}
							}
							return nil
						}))
					}
					return coreNewSub(t, "part-unpark", e.Events, e.Checkpoints, h, opts...)
				}
				sub := newSub(subscriptions.WithMaxRetries(0))
				run := start(t, sub)
				waitCaughtUp(t, sub)
				run.stop(t)
				parked, err := sub.ListParked(ctx)
				require.NoError(t, err)
				require.ElementsMatch(t, []string{poisonA.ID, poisonB.ID}, parkedIDs(parked))

				// Rebuild from the start.
				afterReset.Store(true)
				require.NoError(t, sub.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
					if e.DB != nil {
						return e.Exec(ctx, "DELETE FROM part_unpark")
					}
					proj.mu.Lock()
					defer proj.mu.Unlock()
					proj.counts, proj.last = map[string]int{}, map[string]int{}
					return nil
				}))
				sub = newSub(subscriptions.WithMaxRetries(1_000_000), subscriptions.WithRetryBackoff(5*time.Millisecond, 5*time.Millisecond))
				run = start(t, sub)
				select {
				case <-retriedB:
				case <-time.After(30 * time.Second):
					t.Fatal("poison event B was not delivered again")
				}
				require.Eventually(t, func() bool {
					lags, err := sub.PartitionLags(ctx)
					return err == nil && lags[pa] == 0
				}, 30*time.Second, 5*time.Millisecond, "partition %d did not catch up", pa)
				parked, err = sub.ListParked(ctx)
				require.NoError(t, err)
				require.Equal(t, []string{poisonB.ID}, parkedIDs(parked),
					"A's entry goes with its live delivery; B's stays while its partition has not delivered it")
				require.Equal(t, "poison", parked[0].Error, "B's entry is the one parked before the reset")

				held.Store(false) // B's next retry succeeds
				waitCaughtUp(t, sub)
				run.stop(t)
				parked, err = sub.ListParked(ctx)
				require.NoError(t, err)
				require.Empty(t, parked)
				require.ErrorIs(t, sub.ReplayParked(ctx, poisonB.ID), subscriptions.ErrEventNotParked)
				handled := proj.handled(t)
				require.Len(t, handled, len(evs))
				for _, ev := range evs {
					if e.DB == nil {
						// No transaction: the events before B in its failed
						// batch were handled, and are again.
						require.Positive(t, handled[ev.ID], "event %s", ev.ID)
						continue
					}
					require.Equal(t, 1, handled[ev.ID], "event %s handled %d times since the reset", ev.ID, handled[ev.ID])
				}
				if e.DB != nil {
					require.Empty(t, proj.orderViolations())
				}
			})
		}
	}
}
