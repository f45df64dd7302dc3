package infrastructure_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// BenchmarkMemoryReadAfter reads a page of 100 at the start and at the end
// of histories of 10^3 and 10^6 events: the cost must not grow with the
// history (the spec requires O(log n + limit)).
func BenchmarkMemoryReadAfter(b *testing.B) {
	const page = 100
	for _, size := range []int{1_000, 1_000_000} {
		s := infrastructure.NewMemoryStore()
		ctx := testCtx(b)
		batch := make([]domain.EventEnvelope[any], 0, 1000)
		for i := 0; i < size; i += cap(batch) {
			batch = batch[:0]
			agg := "agg-" + strconv.Itoa(i)
			for j := 0; j < cap(batch) && i+j < size; j++ {
				batch = append(batch, domain.EventEnvelope[any]{
					ID: agg + "-" + strconv.Itoa(j), EventType: "bench", Payload: j,
				})
			}
			require.NoError(b, s.Append(ctx, agg, 0, batch...))
		}
		for _, at := range []struct {
			name  string
			after int64
		}{{"start", 0}, {"end", int64(size - page)}} {
			b.Run(fmt.Sprintf("events=%d/at=%s", size, at.name), func(b *testing.B) {
				for b.Loop() {
					events, err := s.ReadAfter(ctx, at.after, page)
					if err != nil || len(events) != page {
						b.Fatalf("read %d events: %v", len(events), err)
					}
				}
			})
		}
		require.NoError(b, s.Close())
	}
}

// BenchmarkGormAppend appends one event per call on Postgres, from one
// goroutine and from many: appends to one table are serialized by the
// append lock, and this is its price.
func BenchmarkGormAppend(b *testing.B) {
	b.Run("postgres/serial", func(b *testing.B) {
		s := newGormStore(b, dbtest.NewPostgres(b).DB)
		ctx := testCtx(b)
		version := 0
		for b.Loop() {
			if err := s.Append(ctx, "bench", version, newEvent("bench", "x", map[string]any{"n": version})); err != nil {
				b.Fatal(err)
			}
			version++
		}
	})
	b.Run("postgres/parallel", func(b *testing.B) {
		s := newGormStore(b, dbtest.NewPostgres(b).DB)
		ctx := testCtx(b)
		b.RunParallel(func(pb *testing.PB) {
			agg := uniqueID("bench")
			for pb.Next() {
				if err := s.Append(ctx, agg, -1, newEvent(agg, "x", nil)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkPostgresReadAfter reads a page of 1,000 events through
// GormEventStore.ReadAfter (on pgx's session, pgevents.ReadEnvelopes),
// through its portable path (GORM's scan into rows, then the decoding),
// and through a pgx connection of its own with the same decoding.
func BenchmarkPostgresReadAfter(b *testing.B) {
	const page = 1000
	pg := dbtest.NewPostgres(b)
	s := newGormStore(b, pg.DB)
	ctx := testCtx(b)
	for i := 0; i < page; i += 100 {
		evs := make([]domain.EventEnvelope[any], 100)
		for j := range evs {
			evs[j] = newEvent("agg-"+strconv.Itoa(i), "bench", map[string]any{"n": i + j, "note": "bench"})
		}
		require.NoError(b, s.Append(ctx, "agg-"+strconv.Itoa(i), -1, evs...))
	}
	portable := newGormStore(b, pg.DB)
	infrastructure.PortableAppendOnly(portable)
	for _, c := range []struct {
		name  string
		store *infrastructure.GormEventStore
	}{{"store", s}, {"portable", portable}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				events, err := c.store.ReadAfter(ctx, 0, page)
				if err != nil || len(events) != page {
					b.Fatalf("read %d events: %v", len(events), err)
				}
			}
		})
	}
	b.Run("pgx", func(b *testing.B) {
		conn, err := pgx.Connect(ctx, pg.DSN)
		require.NoError(b, err)
		defer func() { _ = conn.Close(ctx) }()
		b.ReportAllocs()
		for b.Loop() {
			rows, err := conn.Query(ctx, pgevents.SelectEvents+"WHERE position > $1 ORDER BY position LIMIT $2", 0, page)
			require.NoError(b, err)
			events, err := pgevents.ReadEnvelopes(rows, page)
			if err != nil || len(events) != page {
				b.Fatalf("read %d events: %v", len(events), err)
			}
		}
	})
}
