package infrastructure_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
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
