package subscriptions

import (
	"context"
	"fmt"
	"testing"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// BenchmarkPartitionRead measures one batch read (100 events) of a
// partition on Postgres, filtered in SQL, beside the unpartitioned read of
// the same feed: 20,000 events of 1,000 aggregates, read from the middle.
//
//	go test -run '^$' -bench BenchmarkPartitionRead -benchtime 200x .
func BenchmarkPartitionRead(b *testing.B) {
	pg := dbtest.NewPostgres(b)
	store, err := infrastructure.NewGormEventStore(pg.DB)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for done := 0; done < 20_000; done += 20 {
		agg := fmt.Sprintf("agg-%d", done/20)
		evs := make([]domain.EventEnvelope[any], 20)
		for i := range evs {
			evs[i] = domain.NewEventEnvelope[any](map[string]any{"n": done + i}, agg, "bench", 0)
		}
		if err := store.Append(ctx, agg, -1, evs...); err != nil {
			b.Fatal(err)
		}
	}
	if err := pg.DB.Exec("ANALYZE events").Error; err != nil {
		b.Fatal(err)
	}
	read := func(b *testing.B, events domain.EventStore) {
		b.Helper()
		for b.Loop() {
			evs, err := events.ReadAfter(ctx, 10_000, 100)
			if err != nil {
				b.Fatal(err)
			}
			if len(evs) != 100 {
				b.Fatalf("read %d events, want 100", len(evs))
			}
		}
	}
	b.Run("unpartitioned", func(b *testing.B) { read(b, store) })
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("partition 0 of %d", n), func(b *testing.B) { read(b, newPartitionFeed(store, 0, n)) })
	}
}
