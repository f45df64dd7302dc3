package pgxstore_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// BenchmarkAppend measures one-event appends with 1 and 16 concurrent
// writers (each on its own aggregate, with its version check) through
// this package's store, with and without coalescing, and through
// infrastructure.GormEventStore, in the same run and on the same server.
// Each store gets a fresh schema and a pool of 8 connections. One op is
// one Append; appends/s is the rate over all writers.
//
//	go test -run '^$' -bench BenchmarkAppend -benchtime 3s ./pgxstore
func BenchmarkAppend(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) domain.EventStore
	}{
		{"gorm", func(b *testing.B) domain.EventStore { pg, _ := newDatabase(b); return newGormEventStore(b, pg) }},
		{"pgx", func(b *testing.B) domain.EventStore { s, _ := newEventStore(b); return s }},
		{"pgx-uncoalesced", func(b *testing.B) domain.EventStore {
			s, _ := newEventStore(b)
			pgxstore.SetAppendCoalescing(s, false)
			return s
		}},
	}
	for _, writers := range []int{1, 16} {
		for _, st := range stores {
			b.Run(fmt.Sprintf("writers=%d/%s", writers, st.name), func(b *testing.B) {
				ctx := testCtx(b)
				s := st.open(b)
				var (
					next    atomic.Int64
					wg      sync.WaitGroup
					failure atomic.Pointer[error]
				)
				b.ResetTimer()
				for w := range writers {
					wg.Go(func() {
						agg := feedtest.UniqueID(fmt.Sprintf("bench-w%d", w))
						for version := 0; next.Add(1) <= int64(b.N); version++ {
							ev := feedtest.NewEvent(agg, "bench.appended", map[string]any{"w": w, "v": version})
							if err := s.Append(ctx, agg, version, ev); err != nil {
								failure.CompareAndSwap(nil, &err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				if err := failure.Load(); err != nil {
					require.NoError(b, *err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
			})
		}
	}
}
