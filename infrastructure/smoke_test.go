package infrastructure_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

func TestSmoke(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s, err := infrastructure.NewGormEventStore(b.Open(t))
			require.NoError(t, err)
			e1 := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "a", "x.created", 0)
			e2 := domain.NewEventEnvelope[any]([]any{"x", 2.5}, "a", "x.updated", 0)
			require.NoError(t, s.Append(ctx, "a", 0, e1, e2))
			require.ErrorIs(t, s.Append(ctx, "a", 0, domain.NewEventEnvelope[any](nil, "a", "x", 0)), domain.ErrConcurrencyConflict)
			evs, err := s.ReadAfter(ctx, 0, 10)
			require.NoError(t, err)
			require.Len(t, evs, 2)
			require.Equal(t, int64(1), evs[0].Position)
			require.Equal(t, map[string]any{"n": 1.0}, evs[0].Payload)
			require.Equal(t, 2, evs[1].SequenceNo)
			h, err := s.HeadPosition(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(2), h)
			_, err = infrastructure.NewGormEventStore(b.Open(t))
			require.NoError(t, err)
		})
	}
}
