package opstatus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/opstatus"
)

func TestRead(t *testing.T) {
	ctx := context.Background()
	store := infrastructure.NewMemoryStore()
	var created []time.Time
	for i := range 4 {
		ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, "agg", "t", i+1)
		require.NoError(t, store.Append(ctx, "agg", i, ev))
		got, err := store.ReadAfter(ctx, int64(i), 1)
		require.NoError(t, err)
		created = append(created, got[0].Created)
	}
	now := created[3].Add(time.Minute)
	at := func(p int64) func(context.Context) (int64, error) {
		return func(context.Context) (int64, error) { return p, nil }
	}
	parked := func(n int, err error) func(context.Context) (int, error) {
		return func(context.Context) (int, error) { return n, err }
	}
	boom := errors.New("opstatus: boom")
	for _, c := range []struct {
		name string
		src  opstatus.Sources
		want opstatus.Status
	}{
		{"caught up", opstatus.Sources{Position: at(4), Parked: parked(2, nil)},
			opstatus.Status{Position: 4, Head: 4, Parked: 2, State: opstatus.StateCaughtUp}},
		{"behind: lag in events and since the oldest unprocessed event", opstatus.Sources{Position: at(1)},
			opstatus.Status{Position: 1, Head: 4, Lag: 3, LagSeconds: now.Sub(created[1]).Seconds(), Parked: -1, State: opstatus.StateBehind}},
		{"ahead of the head", opstatus.Sources{Position: at(9), Parked: parked(0, nil)},
			opstatus.Status{Position: 9, Head: 4, State: opstatus.StateAhead}},
		{"position unreadable", opstatus.Sources{Position: func(context.Context) (int64, error) { return 0, boom }},
			opstatus.Status{Parked: -1, State: opstatus.StateError, Error: boom.Error()}},
		{"parked unreadable", opstatus.Sources{Position: at(4), Parked: parked(0, boom)},
			opstatus.Status{Position: 4, Head: 4, State: opstatus.StateError, Error: boom.Error()}},
	} {
		c.src.Events = store
		c.want.Subscriber = "sub"
		got := opstatus.Read(ctx, "sub", c.src, now)
		require.InDelta(t, c.want.LagSeconds, got.LagSeconds, 1e-6, c.name)
		got.LagSeconds, c.want.LagSeconds = 0, 0
		require.Equal(t, c.want, got, c.name)
	}
}
