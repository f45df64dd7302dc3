package subscriptions

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestPartitionIndexReadsWhatTheHashFilterReads: a partition's read
// through the feed index returns exactly the events the hash-filtered read
// returns, whatever the checkpoint: inside the window, behind it after the
// window dropped its oldest chunks (the read falls back to the filter),
// far past it (the window restarts), and at the head before and after
// more events are appended.
func TestPartitionIndexReadsWhatTheHashFilterReads(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	store, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	appendEvents := func(count int) {
		for done := 0; done < count; {
			agg := fmt.Sprintf("agg-%d", rng.IntN(150))
			k := min(1+rng.IntN(5), count-done)
			evs := make([]domain.EventEnvelope[any], k)
			for i := range evs {
				evs[i] = domain.NewEventEnvelope[any](map[string]any{"n": done + i}, agg, "test", 0)
			}
			require.NoError(t, store.Append(ctx, agg, -1, evs...))
			done += k
		}
	}
	appendEvents(1200)

	for _, tc := range []struct {
		name                  string
		partitions, chunk, cp int
	}{
		{"4 partitions, a window larger than the feed", 4, 100, 1 << 17},
		{"16 partitions, a window that drops chunks", 16, 50, 600},
		{"1 partition", 1, 100, 1 << 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			index := newPartitionIndex(store, tc.partitions)
			index.chunk, index.capacity = tc.chunk, tc.cp
			head, err := store.HeadPosition(ctx)
			require.NoError(t, err)
			// check compares the reads and reports whether the index
			// answered (rather than the fallback).
			check := func(p int, after int64, limit int) bool {
				t.Helper()
				plain := newPartitionFeed(store, p, tc.partitions)
				indexed := newPartitionFeed(store, p, tc.partitions)
				indexed.index = index
				want, err := plain.ReadAfter(ctx, after, limit)
				require.NoError(t, err)
				got, err := indexed.ReadAfter(ctx, after, limit)
				require.NoError(t, err)
				require.Equal(t, positionsOf(want), positionsOf(got), "partition %d after %d, limit %d", p, after, limit)
				_, answered, err := indexed.readIndexed(ctx, after, limit)
				require.NoError(t, err)
				return answered
			}
			// Partitions moving forward together, as a catch-up does.
			for after := int64(0); after < head; after += 37 {
				require.True(t, check(int(after)%tc.partitions, after, 5), "after %d: the index did not answer", after)
			}
			// Checkpoints in any order: behind the window, far past it, at
			// the head.
			for range 40 {
				check(rng.IntN(tc.partitions), rng.Int64N(head+1), 1+rng.IntN(30))
			}
			require.True(t, check(0, head, 10))
			appendEvents(150)
			require.True(t, check(0, head, 10))
			for p := range tc.partitions {
				require.True(t, check(p, head, 200))
			}
			head, err = store.HeadPosition(ctx)
			require.NoError(t, err)
			// A reset moves every partition behind the window: the sweep
			// rewinds it, and the index answers again.
			if tc.cp < 1000 {
				require.Positive(t, index.lo, "the window dropped no chunk")
				index.rewind(0, 0)
				require.True(t, check(1, 0, 5), "the index did not answer after the rewind")
			}
		})
	}
}

func positionsOf(events []domain.EventEnvelope[any]) []int64 {
	out := make([]int64, len(events))
	for i, ev := range events {
		out[i] = ev.Position
	}
	return out
}

// TestIndexedAcquirerLocksBeforeReading: with a feed index, a partition
// whose checkpoint another replica holds is answered errCheckpointHeld
// without reading its events; once free, the batch holds the events the
// hash filter reads; past the head no transaction is opened.
func TestIndexedAcquirerLocksBeforeReading(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	store, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	cps, err := NewGormCheckpointStore(pg.DB)
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 20 {
		agg := fmt.Sprintf("agg-%d", i)
		evs := make([]domain.EventEnvelope[any], 10)
		for j := range evs {
			evs[j] = domain.NewEventEnvelope[any](map[string]any{"n": j}, agg, "test", 0)
		}
		require.NoError(t, store.Append(ctx, agg, -1, evs...))
	}
	feed := newPartitionFeed(store, 1, 4)
	feed.index = newPartitionIndex(store, 4)
	a := indexedAcquirer{feed: feed, checkpoints: cps, fallback: readThenAcquire{events: feed, checkpoints: cps}}
	name := partitionName("sub", 1, 4)

	held, ok, err := cps.Acquire(ctx, name)
	require.NoError(t, err)
	require.True(t, ok)
	batch, events, err := a.acquireAfter(ctx, name, 0, 10, true)
	require.ErrorIs(t, err, errCheckpointHeld)
	require.Nil(t, batch)
	require.Empty(t, events)
	require.NoError(t, held.Rollback())

	batch, events, err = a.acquireAfter(ctx, name, 0, 10, true)
	require.NoError(t, err)
	require.NotNil(t, batch)
	want, err := newPartitionFeed(store, 1, 4).ReadAfter(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, want, 10)
	require.Equal(t, positionsOf(want), positionsOf(events))
	require.NoError(t, batch.Rollback())

	head, err := store.HeadPosition(ctx)
	require.NoError(t, err)
	batch, events, err = a.acquireAfter(ctx, name, head, 10, true)
	require.NoError(t, err)
	require.Nil(t, batch)
	require.Empty(t, events)
}
