package subscriptions_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// TestGroupBackoffHoldsNoWorker runs a poison tenant, whose handler always
// fails, and a healthy one on one worker with an hour's retry backoff: the
// healthy tenant's events are handled while the poison one backs off (the
// backoff holds no worker), and a reset, then a resume, of the poison
// tenant end its backoff at once (its next attempt runs), as Remove ends
// it for good.
func TestGroupBackoffHoldsNoWorker(t *testing.T) {
	tenants := groupMemoryTenants("backoff", 2)
	poison, healthy := tenants[0], tenants[1]
	var mu sync.Mutex
	calls := map[string]int{}
	count := func(tenant string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[tenant]
	}
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tenant := subscriptions.TenantFromContext(ctx)
		mu.Lock()
		calls[tenant]++
		mu.Unlock()
		if tenant == poison.feed.Tenant {
			return errors.New("poison")
		}
		return nil
	}
	g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "proj", Handler: handler, Options: []subscriptions.SubscriberOption{
		subscriptions.WithPollInterval(groupPoll), subscriptions.WithMaxRetries(10), subscriptions.WithRetryBackoff(time.Hour, time.Hour),
	}}}, subscriptions.WithGroupWorkers(1), subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	appendN(t, poison.feed.Events, "E", 0, 1)
	require.NoError(t, g.Add(poison.feed))
	require.NoError(t, g.Add(healthy.feed))
	runGroup(t, g)
	sub, err := g.Subscriber(poison.feed.Tenant, "proj")
	require.NoError(t, err)
	// retrying: the poison tenant backs off after its handler's calls-th
	// call (a reset starts the attempt count again: calls, not Attempts).
	retrying := func(calls int) func() bool {
		return func() bool {
			st, err := sub.Status(context.Background())
			return err == nil && st.State == subscriptions.StateRetrying && count(poison.feed.Tenant) == calls
		}
	}
	require.Eventually(t, retrying(1), 10*time.Second, time.Millisecond, "the poison event's first attempt fails")

	appendN(t, healthy.feed.Events, "E", 0, 3)
	require.Eventually(t, func() bool { return count(healthy.feed.Tenant) == 3 }, 10*time.Second, time.Millisecond,
		"the healthy tenant's events are handled while the poison tenant backs off")
	require.True(t, retrying(1)(), "the poison tenant still backs off")

	require.NoError(t, sub.ResetCheckpoint(context.Background(), 0))
	require.Eventually(t, retrying(2), 10*time.Second, time.Millisecond, "a reset ends the backoff: the next attempt runs")

	require.NoError(t, sub.Pause(context.Background(), "test"))
	require.NoError(t, sub.Resume(context.Background()))
	require.Eventually(t, retrying(3), 10*time.Second, time.Millisecond, "a resume ends the backoff: the next attempt runs")

	require.NoError(t, g.Remove(context.Background(), poison.feed.Tenant)) // returns: no worker waits on it
	require.Equal(t, 3, count(poison.feed.Tenant))
}
