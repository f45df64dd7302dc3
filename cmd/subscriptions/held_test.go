package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// TestHeldEntries: status counts the entries held behind an earlier
// parked event of their aggregate (WithOrderedParking), parked list and
// show name what holds them, and discarding the head leaves the next
// entry heading the queue: on a SQLite file and on Postgres.
func TestHeldEntries(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	for _, c := range cliDatabases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, dsn := c.open(t)
			paid, shipped := heldState(t, db)
			run := func(args ...string) result {
				return runCLI(t, cli, "", nil, append([]string{"-dsn", dsn}, args...)...)
			}

			r := run("status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+3\s+3\s+0\s+\S+\s+2 \(1 held\)\s+-\s+caught up$`, r.stdout)
			r = run("parked", "list")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+3\s+`+shipped+`\s+order\.shipped\s+order-1\s+0\s+\S+\s+held behind `+paid+`$`, r.stdout)
			r = run("parked", "show", shipped)
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^held behind\s+`+regexp.QuoteMeta(paid)+` \(replay or discard that one first\)$`, r.stdout)
			r = run("-json", "parked", "show", shipped)
			require.Equal(t, 0, r.code, r.stderr)
			var shown struct {
				Parked struct {
					HeldBy string `json:"held_by"`
				}
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown), r.stdout)
			require.Equal(t, paid, shown.Parked.HeldBy)

			r = run("-yes", "parked", "discard", paid)
			require.Equal(t, 0, r.code, r.stderr)
			r = run("parked", "list")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+3\s+`+shipped+`\s+order\.shipped\s+order-1\s+0\s+\S+\s+-$`, r.stdout, "the next entry heads the queue: no error, not held")
			r = run("status")
			require.Regexp(t, `(?m)^orders\s+3\s+3\s+0\s+\S+\s+1\s+-\s+caught up$`, r.stdout)
		})
	}
}

// heldState fills db: "orders" with ordered parking parked order-1's
// "paid" and held its "shipped" behind it; order-2 went on. It returns the
// two event IDs.
func heldState(t *testing.T, db *gorm.DB) (paid, shipped string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	parking, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)
	var ids []string
	for _, e := range []struct{ aggregate, typ string }{{"order-2", "order.placed"}, {"order-1", "order.paid"}, {"order-1", "order.shipped"}} {
		ev := domain.NewEventEnvelope[any](map[string]any{}, e.aggregate, e.typ, 0)
		require.NoError(t, events.Append(ctx, e.aggregate, -1, ev))
		ids = append(ids, ev.ID)
	}
	sub, err := subscriptions.NewSubscriber("orders", events, checkpoints, func(_ context.Context, ev domain.EventEnvelope[any]) error {
		if ev.EventType == "order.paid" {
			return errors.New("payment service down")
		}
		return nil
	}, subscriptions.WithParkingLot(parking), subscriptions.WithOrderedParking(), subscriptions.WithMaxRetries(0),
		subscriptions.WithPollInterval(20*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	require.Eventually(t, func() bool {
		st, err := sub.Status(ctx)
		return err == nil && st.Lag == 0 && st.Held == 1
	}, time.Minute, 20*time.Millisecond, "the subscriber did not hold the order's next event")
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Run did not return")
	}
	return ids[1], ids[2]
}
