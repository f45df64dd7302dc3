package feedtest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// RequireFollowerReadsEveryEventOnce appends multi-event batches from many
// goroutines while a follower pages through the feed as a subscriber does:
// every event is read exactly once, in strictly increasing positions, none
// missing, each as it was appended. The stores share one feed (Postgres
// stores on one schema): writer w appends through stores[w%len(stores)]
// and the follower reads through each store in turn, so that with more
// than one store the appenders interleave on one table.
func RequireFollowerReadsEveryEventOnce(t *testing.T, stores ...domain.EventStore) {
	t.Helper()
	require.NotEmpty(t, stores)
	const (
		writers          = 8
		appendsPerWriter = 12
		pageSize         = 50
	)
	ctx := Context(t)
	var (
		mu       sync.Mutex
		appended = map[string]domain.EventEnvelope[any]{}
		wg       sync.WaitGroup
		failures = make(chan error, writers)
		writing  atomic.Int32
	)
	writing.Store(writers)
	for w := range writers {
		s := stores[w%len(stores)]
		wg.Go(func() {
			defer writing.Add(-1)
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			agg := UniqueID(fmt.Sprintf("writer%d", w))
			for i := range appendsPerWriter {
				batch := make([]domain.EventEnvelope[any], 1+rng.IntN(10))
				for j := range batch {
					batch[j] = NewEvent(agg, "batch.item", map[string]any{"w": w, "i": i, "j": j, "s": "ü\"\\"})
					batch[j].Metadata = map[string]any{"writer": float64(w)}
				}
				version, err := s.GetCurrentVersion(ctx, agg)
				if err == nil {
					err = s.Append(ctx, agg, version, batch...)
				}
				if err != nil {
					failures <- err
					return
				}
				mu.Lock()
				for _, e := range batch {
					appended[e.ID] = e
				}
				mu.Unlock()
			}
		})
	}

	// The follower: checkpoint the last position, never look back.
	var (
		last      int64
		delivered []domain.EventEnvelope[any]
		seen      = map[string]bool{}
	)
	for read := 0; ; read++ {
		doneWriting := writing.Load() == 0
		page, err := stores[read%len(stores)].ReadAfter(ctx, last, pageSize)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), pageSize)
		for _, e := range page {
			require.Greater(t, e.Position, last, "positions strictly increase along the feed")
			require.False(t, seen[e.ID], "event %s delivered twice", e.ID)
			seen[e.ID] = true
			last = e.Position
			delivered = append(delivered, e)
		}
		if len(page) == 0 && doneWriting {
			break // nothing was in flight when this empty page was read
		}
	}
	WaitNoErrors(t, &wg, failures)
	require.Len(t, delivered, len(appended))
	for _, s := range stores {
		all, err := s.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Equal(t, IDs(all), IDs(delivered), "%T reads the whole feed, in order", s)
		require.Equal(t, delivered, all, "%T reads every event as the follower did", s)
		head, err := s.HeadPosition(ctx)
		require.NoError(t, err)
		require.Equal(t, last, head)
	}
	for _, e := range delivered {
		want, ok := appended[e.ID]
		require.True(t, ok, "event %s was delivered but not appended", e.ID)
		require.Equal(t, want.AggregateID, e.AggregateID)
		require.Equal(t, want.Metadata, e.Metadata)
		require.True(t, want.Created.Truncate(time.Microsecond).Equal(e.Created))
	}
}
