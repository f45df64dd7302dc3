package subscriptionstest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// parkManagedSuite is the ManagedParkingLot part of TestParkingLotSuite:
// get, filtered and paged listing, discard and recorded replay failures.
func parkManagedSuite(t *testing.T, b parkLotBackend) {
	ctx := context.Background()
	managed := func(t *testing.T) subscriptions.ManagedParkingLot {
		lot := has[subscriptions.ManagedParkingLot](t, b.new(t))
		return lot
	}
	// fill parks ten entries for park-a (positions 10..100, types
	// alternating, aggregates in threes) and one for park-b.
	fill := func(t *testing.T, lot subscriptions.ParkingLot) []subscriptions.ParkedEvent {
		var out []subscriptions.ParkedEvent
		for i := 10; i >= 1; i-- { // parked out of order
			p := parkEntry("park-a", "ev-"+string(rune('a'+i)), int64(i*10))
			p.EventType = []string{"t.even", "t.odd"}[i%2]
			p.AggregateID = []string{"agg-0", "agg-1", "agg-2"}[i%3]
			require.NoError(t, lot.Park(ctx, p))
			out = append([]subscriptions.ParkedEvent{p}, out...)
		}
		require.NoError(t, lot.Park(ctx, parkEntry("park-b", "ev-b", 55)))
		return out
	}
	ids := func(ps []subscriptions.ParkedEvent) []int64 {
		out := []int64{}
		for _, p := range ps {
			out = append(out, p.Position)
		}
		return out
	}

	t.Run("get", func(t *testing.T) {
		lot := managed(t)
		all := fill(t, lot)
		got, err := lot.Get(ctx, "park-a", all[3].EventID)
		require.NoError(t, err)
		parkRequireSame(t, all[3], got)
		_, err = lot.Get(ctx, "park-b", all[3].EventID)
		require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
		_, err = lot.Get(ctx, "park-a", "ev-none")
		require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
	})

	t.Run("list filtered and paged", func(t *testing.T) {
		lot := managed(t)
		fill(t, lot)
		for _, c := range []struct {
			name   string
			filter subscriptions.ParkedFilter
			want   []int64
		}{
			{"everything", subscriptions.ParkedFilter{}, []int64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}},
			{"by type", subscriptions.ParkedFilter{EventType: "t.odd"}, []int64{10, 30, 50, 70, 90}},
			{"by aggregate", subscriptions.ParkedFilter{AggregateID: "agg-1"}, []int64{10, 40, 70, 100}},
			{"by both", subscriptions.ParkedFilter{EventType: "t.even", AggregateID: "agg-1"}, []int64{40, 100}},
			{"first page", subscriptions.ParkedFilter{Limit: 3}, []int64{10, 20, 30}},
			{"next page", subscriptions.ParkedFilter{Limit: 3, AfterPosition: 30}, []int64{40, 50, 60}},
			{"last page", subscriptions.ParkedFilter{Limit: 3, AfterPosition: 90}, []int64{100}},
			{"past the end", subscriptions.ParkedFilter{Limit: 3, AfterPosition: 100}, []int64{}},
			{"filtered page", subscriptions.ParkedFilter{EventType: "t.odd", Limit: 2, AfterPosition: 10}, []int64{30, 50}},
			{"negative limit is no limit", subscriptions.ParkedFilter{Limit: -1, AfterPosition: 80}, []int64{90, 100}},
			{"no match", subscriptions.ParkedFilter{EventType: "t.none"}, []int64{}},
		} {
			got, err := lot.ListFiltered(ctx, "park-a", c.filter)
			require.NoError(t, err, c.name)
			require.NotNil(t, got, c.name)
			require.Equal(t, c.want, ids(got), c.name)
		}
		got, err := lot.ListFiltered(ctx, "park-b", subscriptions.ParkedFilter{})
		require.NoError(t, err)
		require.Equal(t, []int64{55}, ids(got))
	})

	t.Run("discard", func(t *testing.T) {
		lot := managed(t)
		all := fill(t, lot)
		got, err := lot.Discard(ctx, "park-a", all[4].EventID)
		require.NoError(t, err)
		parkRequireSame(t, all[4], got)
		_, err = lot.Discard(ctx, "park-a", all[4].EventID)
		require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "a discarded event is no longer parked")
		_, err = lot.Discard(ctx, "park-b", all[5].EventID)
		require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "another subscriber's entry is not touched")
		left, err := lot.List(ctx, "park-a")
		require.NoError(t, err)
		require.Equal(t, []int64{10, 20, 30, 40, 60, 70, 80, 90, 100}, ids(left))
		other, err := lot.List(ctx, "park-b")
		require.NoError(t, err)
		require.Len(t, other, 1)
	})

	t.Run("record replay failure", func(t *testing.T) {
		lot := managed(t)
		all := fill(t, lot)
		at := parkAt(time.Hour)
		require.NoError(t, lot.RecordReplayFailure(ctx, "park-a", all[0].EventID, "replay: still broken", at))
		got, err := lot.Get(ctx, "park-a", all[0].EventID)
		require.NoError(t, err)
		want := all[0]
		want.Attempts++
		want.Error = "replay: still broken"
		want.ParkedAt = at
		parkRequireSame(t, want, got)
		require.NoError(t, lot.RecordReplayFailure(ctx, "park-a", "ev-none", "x", at), "an entry gone meanwhile is not an error")
		_, err = lot.Get(ctx, "park-a", "ev-none")
		require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "recording does not create an entry")
	})

	t.Run("discard during a replay is ErrReplayInProgress", func(t *testing.T) {
		lot := managed(t)
		p := parkEntry("park-a", "ev-1", 1)
		require.NoError(t, lot.Park(ctx, p))
		entered, release := make(chan struct{}), make(chan struct{})
		releaseOnce := sync.OnceFunc(func() { close(release) })
		defer releaseOnce()
		done := make(chan error, 1)
		go func() {
			done <- lot.Replay(ctx, "park-a", "ev-1", domain.EventEnvelope[any]{ID: "ev-1"}, func(context.Context, domain.EventEnvelope[any]) error {
				close(entered)
				<-release
				return nil
			})
		}()
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the replay never ran its handler")
		}
		// The discard must answer while the replay still runs.
		discarded := make(chan error, 1)
		go func() {
			_, err := lot.Discard(ctx, "park-a", "ev-1")
			discarded <- err
		}()
		var err error
		select {
		case err = <-discarded:
		case <-time.After(30 * time.Second):
			releaseOnce()
			t.Fatal("the discard waited for the replay instead of refusing")
		}
		releaseOnce()
		require.ErrorIs(t, err, subscriptions.ErrReplayInProgress)
		select {
		case err := <-done:
			require.NoError(t, err, "the replay is not disturbed")
		case <-time.After(30 * time.Second):
			t.Fatal("the replay did not return")
		}
		_, err = lot.Discard(ctx, "park-a", "ev-1")
		require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "the replay cleared the entry")
	})
}
