package subscriptionstest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// RunPartitionFeedSuite runs the contracts of the event-store capabilities
// partitioned subscribers use, subscriptions.PartitionFeed and
// subscriptions.FeedIndex, against the store h builds, as subtests of t
// named h.Name/<Capability>/<case> (each skipped when the store does not
// have it): what a partition reads is the feed filtered with
// subscriptions.PartitionOf, in feed order, its count agrees, and the
// index reads the feed's positions and aggregates and events by position.
func RunPartitionFeedSuite(t *testing.T, h EventStoreHarness) {
	ctx := context.Background()
	seed := func(t *testing.T, s domain.EventStore) []domain.EventEnvelope[any] {
		t.Helper()
		for i := range 60 {
			agg := fmt.Sprintf("part-agg-%d", i%13)
			ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, agg, "suite.partition", 0)
			require.NoError(t, s.Append(ctx, agg, -1, ev))
		}
		feed, err := s.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		return feed
	}
	t.Run(h.Name+"/PartitionFeed", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		s := h.New(t)
		pf := has[subscriptions.PartitionFeed](t, s)
		feed := seed(t, s)
		const n = 4
		for p := range n {
			want := []string{}
			for _, ev := range feed[10:] {
				if subscriptions.PartitionOf(ev.AggregateID, n) == p {
					want = append(want, ev.ID)
				}
			}
			after := feed[9].Position
			got, err := pf.ReadPartitionAfter(ctx, after, 0, p, n)
			require.NoError(t, err)
			require.Equal(t, want, ids(got), "partition %d of %d after %d", p, n, after)
			limited, err := pf.ReadPartitionAfter(ctx, after, 3, p, n)
			require.NoError(t, err)
			require.Equal(t, want[:min(3, len(want))], ids(limited))
			count, err := pf.CountPartitionAfter(ctx, after, feed[len(feed)-1].Position, p, n)
			require.NoError(t, err)
			require.EqualValues(t, len(want), count)
			count, err = pf.CountPartitionAfter(ctx, after, feed[20].Position, p, n)
			require.NoError(t, err)
			var upTo int64
			for _, ev := range feed[10:21] {
				if subscriptions.PartitionOf(ev.AggregateID, n) == p {
					upTo++
				}
			}
			require.Equal(t, upTo, count, "counted up to the head given")
		}
	})
	t.Run(h.Name+"/FeedIndex", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		s := h.New(t)
		fi := has[subscriptions.FeedIndex](t, s)
		feed := seed(t, s)
		positions, aggregates, err := fi.ReadAggregatesAfter(ctx, feed[4].Position, 10)
		require.NoError(t, err)
		require.Len(t, positions, 10)
		require.Len(t, aggregates, 10)
		for i := range positions {
			require.Equal(t, feed[5+i].Position, positions[i])
			require.Equal(t, feed[5+i].AggregateID, aggregates[i])
		}
		got, err := fi.ReadPositions(ctx, []int64{feed[7].Position, feed[2].Position, feed[len(feed)-1].Position + 10})
		require.NoError(t, err)
		require.Equal(t, []string{feed[2].ID, feed[7].ID}, ids(got), "in position order, a missing one left out")
		requireJSONEqual(t, feed[2].Payload, got[0].Payload)
		got, err = fi.ReadPositions(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, got)
	})
}
