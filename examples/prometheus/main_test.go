package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"strings"
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
		`subscriptions_lag_events{`,
		`subscriptions_lag_age_seconds{`,
		`subscriptions_parked{`,
		"# TYPE subscriptions_parked gauge",
	} {
		require.Contains(t, got, want)
	}
}

// TestLagSVG: the plot is well-formed XML with one line per panel.
func TestLagSVG(t *testing.T) {
	svg := lagSVG([]sample{{0, 100, 60}, {time.Second, 50, 30}, {2 * time.Second, 0, 0}})
	require.NoError(t, xml.Unmarshal([]byte(svg), new(struct{})))
	require.Equal(t, 2, strings.Count(svg, "<polyline"))
}
