package admin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
)

// TestCheckReset: the rule of both surfaces' resets allows 0 to the head,
// refuses a position past it with a *BeyondHeadError naming both, and
// passes on the error of reading the head.
func TestCheckReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := envBackends()[0].New(t)
	appendN(t, e.Events, "reset.ev", 0, 3)
	store := &failingStore{EventStore: e.Events}
	sub, err := subscriptions.NewSubscriber("resettable", store, e.Cps, func(context.Context, domain.EventEnvelope[any]) error { return nil })
	require.NoError(t, err)

	for _, p := range []int64{0, 2, 3} {
		require.NoError(t, admin.CheckReset(ctx, sub, p), p)
	}
	err = admin.CheckReset(ctx, sub, 4)
	var beyond *admin.BeyondHeadError
	require.ErrorAs(t, err, &beyond)
	require.Equal(t, admin.BeyondHeadError{Subscriber: "resettable", Position: 4, Head: 3}, *beyond)
	require.EqualError(t, err, `position 4 is beyond the feed head 3: subscriber "resettable" would skip the events appended until the feed reaches it; nothing was changed`)
	require.ErrorContains(t, admin.CheckReset(ctx, sub, -1), "negative")

	store.fail.Store(true)
	err = admin.CheckReset(ctx, sub, 1)
	require.Error(t, err)
	require.False(t, errors.As(err, &beyond), "a failed read is not a refusal")
	require.ErrorContains(t, err, "the database is away")
	require.Contains(t, err.Error(), `reset of "resettable"`)
}
