package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOnce runs the example's -once mode and checks the series a
// Prometheus server would scrape.
func TestOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, "127.0.0.1:0", true, &out))
	got := out.String()
	for _, want := range []string{
		`subscriptions_events_total{otel_scope_name="github.com/eventfeed/subscriptions"`,
		`subscriptions_outcome="handled",subscriptions_subscriber="order-counts"} 38`,
		`subscriptions_outcome="parked",subscriptions_subscriber="order-counts"} 2`,
		`subscriptions_outcome="retried",subscriptions_subscriber="order-counts"} 4`,
		"# TYPE subscriptions_handler_duration_seconds histogram",
		"# TYPE subscriptions_batch_duration_seconds histogram",
		`subscriptions_lag{`,
		`subscriptions_lag_time_seconds{`,
		`subscriptions_parked{`,
	} {
		require.Contains(t, got, want)
	}
}
