package subscriptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// feedReadEvents is the history BenchmarkPostgresFeedRead catches up on.
const feedReadEvents = 10_000

// BenchmarkPostgresFeedRead: a catch-up with a handler that does nothing,
// so that what is measured is the read path (acquire, read, decode, hand
// over, commit) on each Postgres backend, with a per-event handler and
// with a batch handler, at batch 100 and 1,000: the library's side of
// cmd/subbench's feed read scenario, for profiling (-cpuprofile,
// -memprofile). It reports the time and allocations per event.
func BenchmarkPostgresFeedRead(b *testing.B) {
	pg := dbtest.NewPostgres(b)
	gormEvents, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(b, err)
	coreAppendBulk(b, gormEvents, feedReadEvents)
	gormCPS, err := subscriptions.NewGormCheckpointStore(pg.DB)
	require.NoError(b, err)
	ctx := context.Background()
	pool := pg.OpenPgx(b)
	pgxEvents, err := pgxstore.NewEventStore(ctx, pool)
	require.NoError(b, err)
	pgxCPS, err := pgxstore.NewCheckpointStore(ctx, pool)
	require.NoError(b, err)
	backends := []struct {
		name   string
		events domain.EventStore
		cps    subscriptions.CheckpointStore
	}{{"gorm", gormEvents, gormCPS}, {"pgx", pgxEvents, pgxCPS}}
	run := 0
	for _, be := range backends {
		for _, batchHandler := range []bool{false, true} {
			for _, batch := range []int{100, 1000} {
				handler := "event"
				if batchHandler {
					handler = "batch"
				}
				b.Run(fmt.Sprintf("backend=%s/handler=%s/batch=%d", be.name, handler, batch), func(b *testing.B) {
					b.ReportAllocs()
					var total time.Duration
					for range b.N {
						run++
						total += feedCatchUp(b, be.events, be.cps, fmt.Sprintf("feed-%d", run), batch, batchHandler)
					}
					b.ReportMetric(float64(total.Nanoseconds())/float64(b.N)/feedReadEvents, "ns/event")
				})
			}
		}
	}
}

// feedCatchUp runs a subscriber with a no-op handler (or batch handler)
// from 0 until it handled feedReadEvents events, and returns that time;
// then it stops the subscriber (its last batch commits).
func feedCatchUp(b *testing.B, events domain.EventStore, cps subscriptions.CheckpointStore, name string, batch int, batchHandler bool) time.Duration {
	b.Helper()
	done := make(chan struct{})
	seen := func(position int64) {
		if position == feedReadEvents {
			close(done)
		}
	}
	opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(batch), subscriptions.WithPollInterval(time.Hour), subscriptions.WithLogger(quietLogger())}
	var h subscriptions.Handler
	if batchHandler {
		opts = append(opts, subscriptions.WithBatchHandler(func(_ context.Context, events []domain.EventEnvelope[any]) error {
			seen(events[len(events)-1].Position)
			return nil
		}))
	} else {
		h = func(_ context.Context, ev domain.EventEnvelope[any]) error {
			seen(ev.Position)
			return nil
		}
	}
	sub, err := subscriptions.NewSubscriber(name, events, cps, h, opts...)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	began := time.Now()
	go func() { result <- sub.Run(ctx) }()
	select {
	case <-done:
	case err := <-result:
		b.Fatalf("Run returned early: %v", err)
	}
	took := time.Since(began)
	cancel()
	require.NoError(b, <-result)
	return took
}

// TestPipelinedAcquireUndecodableEvent: a stored event that encoding/json
// cannot decode (valid jsonb beyond float64) fails the pipelined acquire
// of both Postgres backends as an undecodable event, holding nothing: the
// checkpoint is free for the next batch at once.
func TestPipelinedAcquireUndecodableEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		if !b.Postgres {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			appendN(t, e.Events, "decode.test", 0, 1)
			require.NoError(t, e.DB.Exec(`INSERT INTO events (id, aggregate_id, event_type, sequence_no, position, payload, metadata, created_at)
				VALUES ('huge', 'agg-huge', 't', 1, 2, '1e400'::jsonb, '{}'::jsonb, now())`).Error)
			fa, ok := e.Checkpoints.(subscriptions.FeedAcquirer)
			require.True(t, ok)
			batch, acquired, err := e.Checkpoints.Acquire(ctx, "undecodable")
			require.NoError(t, err)
			require.True(t, acquired)
			require.NoError(t, batch.Commit(ctx, 0))

			_, _, _, err = fa.AcquireAfter(ctx, "undecodable", 0, 10)
			var undecodable *pgevents.DecodeError
			require.ErrorAs(t, err, &undecodable)
			require.Equal(t, "huge", undecodable.ID)
			batch, acquired, err = e.Checkpoints.Acquire(ctx, "undecodable")
			require.NoError(t, err)
			require.True(t, acquired, "the failed acquire holds nothing")
			require.NoError(t, batch.Rollback())
		})
	}
}
