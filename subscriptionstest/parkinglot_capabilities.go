package subscriptionstest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// RunDeliveredClearerSuite runs the contracts of the parking-lot
// capabilities a live delivery uses, subscriptions.DeliveredClearer,
// subscriptions.PartitionDeliveredClearer and subscriptions.ParkedCounter,
// against the lot h builds, as subtests of t named h.Name/<Capability>/<case>
// (each skipped when the lot does not have it). RunParkingLotSuite runs
// it. Outside a batch (no transaction in the context) the removal takes
// effect at once.
func RunDeliveredClearerSuite(t *testing.T, h ParkingLotHarness) {
	ctx := context.Background()
	seed := func(t *testing.T, lot subscriptions.ParkingLot) {
		t.Helper()
		for _, e := range []subscriptions.ParkedEvent{
			parkEntry("clear-a", "ev-5", 5), parkEntry("clear-a", "ev-10", 10),
			parkEntry("clear-a", "ev-15", 15), parkEntry("clear-b", "ev-10", 10),
		} {
			require.NoError(t, lot.Park(ctx, e))
		}
	}
	listed := func(t *testing.T, lot subscriptions.ParkingLot, subscriber string) []string {
		t.Helper()
		got, err := lot.List(ctx, subscriber)
		require.NoError(t, err)
		out := make([]string, len(got))
		for i, p := range got {
			out[i] = p.EventID
		}
		return out
	}
	t.Run(h.Name+"/DeliveredClearer", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		lot := h.New(t)
		c := has[subscriptions.DeliveredClearer](t, lot)
		seed(t, lot)
		require.False(t, c.ClearsInBatch(ctx), "no batch transaction in the context")
		require.NoError(t, c.ClearDelivered(ctx, "clear-a", 5, 10))
		require.Equal(t, []string{"ev-5", "ev-15"}, listed(t, lot, "clear-a"), "positions in (5, 10] only")
		require.Equal(t, []string{"ev-10"}, listed(t, lot, "clear-b"), "another subscriber's entries stay")
	})
	t.Run(h.Name+"/PartitionDeliveredClearer", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		lot := h.New(t)
		c := has[subscriptions.PartitionDeliveredClearer](t, lot)
		seed(t, lot)
		const n = 2
		p := subscriptions.PartitionOf("agg-ev-10", n)
		require.NoError(t, c.ClearPartitionDelivered(ctx, "clear-a", 1-p, n, 0, 20))
		var want []string
		for _, id := range []string{"ev-5", "ev-10", "ev-15"} {
			if subscriptions.PartitionOf("agg-"+id, n) == p {
				want = append(want, id)
			}
		}
		require.Equal(t, want, listed(t, lot, "clear-a"), "only the other partition's entries went")
		require.NoError(t, c.ClearPartitionDelivered(ctx, "clear-a", p, n, 0, 20))
		require.Empty(t, listed(t, lot, "clear-a"))
		require.Equal(t, []string{"ev-10"}, listed(t, lot, "clear-b"))
	})
	t.Run(h.Name+"/ParkedCounter", func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		lot := h.New(t)
		c := has[subscriptions.ParkedCounter](t, lot)
		seed(t, lot)
		for subscriber, want := range map[string]int{"clear-a": 3, "clear-b": 1, "clear-nobody": 0} {
			n, err := c.CountParked(ctx, subscriber)
			require.NoError(t, err)
			require.Equal(t, want, n, subscriber)
		}
	})
}
