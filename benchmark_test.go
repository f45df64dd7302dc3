package subscriptions_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
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
)

// coreAppendBulk appends n small events in chunks of 100 per aggregate, far
// faster than one Append per event.
func coreAppendBulk(b *testing.B, store domain.EventStore, n int) {
	b.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		chunk := min(100, n-done)
		agg := fmt.Sprintf("bench-%d", done/100)
		evs := make([]domain.EventEnvelope[any], chunk)
		for i := range evs {
			evs[i] = domain.NewEventEnvelope[any](map[string]any{"n": done + i}, agg, "core.bench", 0)
		}
		require.NoError(b, store.Append(ctx, agg, -1, evs...))
		done += chunk
	}
}

// coreCatchUp runs a subscriber named name on events and cps, batches of
// batch, no polling, until handler has been called want times, then stops
// it (the last batch drains and commits). It returns the time until the
// want-th handler call and the time until Run returned. (A subscriber with
// more events ahead keeps going until it sees the cancellation, so only
// the first figure counts exactly want events.)
func coreCatchUp(b *testing.B, events domain.EventStore, cps subscriptions.CheckpointStore, name string, batch, want int, handler subscriptions.Handler) (toLast, total time.Duration) {
	return catchUp(b, events, cps, name, want, handler,
		subscriptions.WithBatchSize(batch), subscriptions.WithPollInterval(time.Hour), subscriptions.WithLogger(quietLogger()))
}

// catchUp is coreCatchUp with the subscriber's options given: the one home
// of "run until the want-th handler call, then stop" for the benchmarks.
func catchUp(b *testing.B, events domain.EventStore, cps subscriptions.CheckpointStore, name string, want int, handler subscriptions.Handler, opts ...subscriptions.SubscriberOption) (toLast, total time.Duration) {
	b.Helper()
	var seen atomic.Int64
	done := make(chan struct{})
	var began time.Time
	h := func(ctx context.Context, ev coreEnvelope) error {
		if err := handler(ctx, ev); err != nil {
			return err
		}
		if seen.Add(1) == int64(want) {
			toLast = time.Since(began)
			close(done)
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber(name, events, cps, h, opts...)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	began = time.Now()
	go func() { result <- sub.Run(ctx) }()
	select {
	case <-done:
	case err := <-result:
		b.Fatalf("Run returned early: %v", err)
	}
	cancel()
	require.NoError(b, <-result)
	return toLast, time.Since(began)
}

func coreNoop(context.Context, coreEnvelope) error { return nil }

// BenchmarkBatchCycleMemory: one batch cycle of 100 and of 1000 events
// (batch size = events) on MemoryStore and MemoryCheckpointStore with a
// no-op handler, measured as a whole Run from start to checkpoint.
func BenchmarkBatchCycleMemory(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			store := infrastructure.NewMemoryStore()
			coreAppendBulk(b, store, n)
			b.ReportAllocs()
			b.ResetTimer()
			var total time.Duration
			for i := 0; i < b.N; i++ {
				_, d := coreCatchUp(b, store, subscriptions.NewMemoryCheckpointStore(), "bench", n, n, coreNoop)
				total += d
			}
			b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "events/s")
		})
	}
}

// coreHistories caches the big in-memory histories across the benchmark's
// repeated runs.
var coreHistories sync.Map // int -> *infrastructure.MemoryStore

// BenchmarkCatchUpMemory: catching up must not slow down as history grows.
// For a history of 10^3 and of 10^6 events it measures the rate over the
// first 1000 events of the feed and over the last 1000, alternating which
// comes first, and reports the rates of the median iterations (a garbage
// collection cycle over a million envelopes would otherwise dominate the
// mean of whichever window it happens to hit).
func BenchmarkCatchUpMemory(b *testing.B) {
	const window = 1000
	for _, history := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("history=%d", history), func(b *testing.B) {
			var store *infrastructure.MemoryStore
			if s, ok := coreHistories.Load(history); ok {
				store = s.(*infrastructure.MemoryStore)
			} else {
				store = infrastructure.NewMemoryStore()
				coreAppendBulk(b, store, history)
				coreHistories.Store(history, store)
			}
			ctx := context.Background()
			runtime.GC() // collect the construction garbage before measuring
			b.ResetTimer()
			atStart := make([]time.Duration, 0, b.N)
			atEnd := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				cps := subscriptions.NewMemoryCheckpointStore()
				first, second := int64(0), int64(history-window)
				if i%2 == 1 {
					first, second = second, first
				}
				require.NoError(b, cps.Reset(ctx, "bench", first))
				d1, _ := coreCatchUp(b, store, cps, "bench", 100, window, coreNoop)
				require.NoError(b, cps.Reset(ctx, "bench", second))
				d2, _ := coreCatchUp(b, store, cps, "bench", 100, window, coreNoop)
				if i%2 == 1 {
					d1, d2 = d2, d1
				}
				atStart, atEnd = append(atStart, d1), append(atEnd, d2)
			}
			b.ReportMetric(window/coreMedian(atStart).Seconds(), "events/s-start")
			b.ReportMetric(window/coreMedian(atEnd).Seconds(), "events/s-end")
		})
	}
}

func coreMedian(ds []time.Duration) time.Duration {
	sorted := append([]time.Duration(nil), ds...)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

const coreBenchEvents = 1000

// coreBenchPostgres prepares a Postgres schema with coreBenchEvents events
// and an upsert projection.
func coreBenchPostgres(b *testing.B) (*dbtest.Postgres, *infrastructure.GormEventStore) {
	b.Helper()
	pg := dbtest.NewPostgres(b)
	events, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(b, err)
	coreAppendBulk(b, events, coreBenchEvents)
	require.NoError(b, pg.DB.Exec("CREATE TABLE core_bench_projection (event_id text PRIMARY KEY, position bigint NOT NULL, seen bigint NOT NULL)").Error)
	return pg, events
}

const coreBenchUpsert = `INSERT INTO core_bench_projection (event_id, position, seen) VALUES (?, ?, 1)
	ON CONFLICT (event_id) DO UPDATE SET position = excluded.position, seen = core_bench_projection.seen + 1`

// BenchmarkPostgresProjection: a subscriber upserting one projection row
// per event through TxFromContext, batches of 100.
func BenchmarkPostgresProjection(b *testing.B) {
	pg, events := coreBenchPostgres(b)
	cps, err := subscriptions.NewGormCheckpointStore(pg.DB)
	require.NoError(b, err)
	upsert := func(ctx context.Context, ev coreEnvelope) error {
		return subscriptions.TxFromContext(ctx).Exec(coreBenchUpsert, ev.ID, ev.Position).Error
	}
	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		_, d := coreCatchUp(b, events, cps, fmt.Sprintf("bench-%d", i), 100, coreBenchEvents, upsert)
		total += d
	}
	b.ReportMetric(coreBenchEvents*float64(b.N)/total.Seconds(), "events/s")
}

// BenchmarkPostgresPlainLoop is the baseline for BenchmarkPostgresProjection
// without this library: the same reads of the events table and the same
// upserts, in plain transactions of 100 events that lock and update a
// checkpoint row, through the same *gorm.DB.
func BenchmarkPostgresPlainLoop(b *testing.B) {
	pg, _ := coreBenchPostgres(b)
	db := pg.DB
	require.NoError(b, db.Exec("CREATE TABLE core_plain_checkpoints (name text PRIMARY KEY, position bigint NOT NULL)").Error)
	ctx := context.Background()
	b.ResetTimer()
	began := time.Now()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("plain-%d", i)
		require.NoError(b, db.Exec("INSERT INTO core_plain_checkpoints (name, position) VALUES (?, 0)", name).Error)
		handled := 0
		for {
			var batch []infrastructure.GormEventModel
			err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				var position int64
				if err := tx.Raw("SELECT position FROM core_plain_checkpoints WHERE name = ? FOR UPDATE", name).Scan(&position).Error; err != nil {
					return err
				}
				if err := tx.Raw("SELECT * FROM events WHERE position > ? ORDER BY position LIMIT 100", position).Scan(&batch).Error; err != nil {
					return err
				}
				if len(batch) == 0 {
					return nil
				}
				for _, ev := range batch {
					if err := tx.Exec(coreBenchUpsert, ev.ID, ev.Position).Error; err != nil {
						return err
					}
				}
				return tx.Exec("UPDATE core_plain_checkpoints SET position = ? WHERE name = ?", batch[len(batch)-1].Position, name).Error
			})
			require.NoError(b, err)
			if len(batch) == 0 {
				break
			}
			handled += len(batch)
		}
		require.Equal(b, coreBenchEvents, handled)
	}
	b.ReportMetric(coreBenchEvents*float64(b.N)/time.Since(began).Seconds(), "events/s")
}

// BenchmarkSQLiteBatchCycle: one batch of 1000 events (batch size 1000) on
// a SQLite file with each driver, from start to checkpoint: a no-op
// handler, and one that inserts a projection row through TxFromContext.
// It measures what the batch machinery costs per event on SQLite (the
// pinned connection, the check that the transaction still stands).
func BenchmarkSQLiteBatchCycle(b *testing.B) {
	for _, d := range []dbtest.SQLiteDriver{dbtest.Mattn, dbtest.Glebarez} {
		for _, write := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/write=%t", d.Name, write), func(b *testing.B) {
				db := d.OpenDSN(b, d.FileDSN(b.TempDir()+"/bench.db"))
				events, err := infrastructure.NewGormEventStore(db)
				require.NoError(b, err)
				cps, err := subscriptions.NewGormCheckpointStore(db)
				require.NoError(b, err)
				coreAppendBulk(b, events, coreBenchEvents)
				require.NoError(b, db.Exec("CREATE TABLE core_bench_projection (event_id text PRIMARY KEY, position bigint NOT NULL, seen bigint NOT NULL)").Error)
				handler := subscriptions.Handler(coreNoop)
				if write {
					handler = func(ctx context.Context, ev coreEnvelope) error {
						return subscriptions.TxFromContext(ctx).Exec(coreBenchUpsert, ev.ID, ev.Position).Error
					}
				}
				b.ResetTimer()
				var total time.Duration
				for i := 0; i < b.N; i++ {
					name := fmt.Sprintf("bench-%d", i)
					d, _ := coreCatchUp(b, events, cps, name, coreBenchEvents, coreBenchEvents, handler)
					total += d
				}
				b.ReportMetric(float64(total.Microseconds())/float64(b.N*coreBenchEvents), "µs/event")
			})
		}
	}
}
