package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// pauseCounts counts each event's handler calls per subscriber name.
type pauseCounts struct {
	mu    sync.Mutex
	calls map[string]map[string]int
	total map[string]int
}

func (c *pauseCounts) handler(name string) subscriptions.Handler {
	return func(_ context.Context, ev domain.EventEnvelope[any]) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.calls == nil {
			c.calls, c.total = map[string]map[string]int{}, map[string]int{}
		}
		if c.calls[name] == nil {
			c.calls[name] = map[string]int{}
		}
		c.calls[name][ev.ID]++
		c.total[name]++
		return nil
	}
}

func (c *pauseCounts) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total[name]
}

// TestPauseCommand: `subscriptions pause` (another process) stops a
// partitioned subscriber's replicas running in this process, and a
// replica started while it is paused (a restart), while an unpaused
// subscriber of the same database goes on; status shows the pause (table,
// note and JSON) and so does every replica's Status; pause and resume ask
// first; resume lets every replica go on, and each event is handled
// exactly once. SQLite file and Postgres.
func TestPauseCommand(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	for _, c := range cliDatabases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, dsn := c.open(t)
			events, err := infrastructure.NewGormEventStore(db)
			require.NoError(t, err)
			checkpoints, err := subscriptions.NewGormCheckpointStore(db)
			require.NoError(t, err)
			appendSome := func(first, n int) {
				t.Helper()
				for i := first; i < first+n; i++ {
					env := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("order-%d", i), "order.placed", 0)
					require.NoError(t, events.Append(ctx, env.AggregateID, 0, env))
				}
			}
			appendSome(0, 9)
			counts := &pauseCounts{}
			newSub := func(name string, partitions int) *subscriptions.Subscriber {
				opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(10 * time.Millisecond),
					subscriptions.WithLogger(slog.New(slog.DiscardHandler))}
				if partitions > 0 {
					opts = append(opts, subscriptions.WithPartitions(partitions), subscriptions.WithConcurrency(partitions))
				}
				sub, err := subscriptions.NewSubscriber(name, events, checkpoints, counts.handler(name), opts...)
				require.NoError(t, err)
				return sub
			}
			type replica struct {
				sub  *subscriptions.Subscriber
				stop func()
			}
			run := func(sub *subscriptions.Subscriber) replica {
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- sub.Run(rctx) }()
				var once sync.Once
				stop := func() {
					once.Do(func() {
						cancel()
						select {
						case err := <-done:
							require.NoError(t, err)
						case <-time.After(30 * time.Second):
							t.Error("Run did not return within 30 s of its cancellation")
						}
					})
				}
				t.Cleanup(stop)
				return replica{sub, stop}
			}
			caughtUp := func(sub *subscriptions.Subscriber) {
				t.Helper()
				require.Eventually(t, func() bool {
					lag, err := sub.Lag(ctx)
					return err == nil && lag == 0
				}, time.Minute, 10*time.Millisecond, "%s did not catch up", sub.Name())
			}
			orders := []replica{run(newSub("orders", 3)), run(newSub("orders", 3))}
			plain := run(newSub("plain", 0))
			caughtUp(orders[0].sub)
			caughtUp(plain.sub)
			cmd := func(stdin string, args ...string) result {
				return runCLI(t, cli, stdin, nil, append([]string{"-dsn", dsn}, args...)...)
			}

			r := cmd("n\n", "pause", "orders", "-reason", "bad deploy 4.2")
			require.Equal(t, exitDeclined, r.code, r.stderr)
			require.Contains(t, r.stderr, `Pause subscriber "orders" (its 3 partitions) everywhere? Every replica, in every process, stops at its next batch`)
			st, err := orders[0].sub.Status(ctx)
			require.NoError(t, err)
			require.False(t, st.Paused, "a declined pause pauses nothing")

			r = cmd("y\n", "pause", "orders", "-reason", "bad deploy 4.2")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `^paused: subscriber "orders" \(its 3 partitions\) everywhere since \S+Z: bad deploy 4\.2\n$`, r.stdout)
			require.Regexp(t, `subscriber paused.*by=cli:\S+ .*reason="bad deploy 4\.2"`, r.stderr, "the audit line")

			// Nothing of orders is handled, by the replicas running here nor
			// by one started now; plain goes on.
			before := counts.count("orders")
			orders[1].stop()
			orders = append(orders, run(newSub("orders", 3)))
			appendSome(9, 12)
			caughtUp(plain.sub)
			require.Never(t, func() bool { return counts.count("orders") != before }, 300*time.Millisecond, 5*time.Millisecond,
				"orders handled an event while paused")
			for _, o := range []replica{orders[0], orders[2]} {
				st, err := o.sub.Status(ctx)
				require.NoError(t, err)
				require.True(t, st.Paused, "every replica's Status")
				require.Equal(t, "bad deploy 4.2", st.PauseReason)
				require.EqualValues(t, 12, st.Lag)
				require.NoError(t, o.sub.Healthy(ctx), "paused, not stuck")
			}

			r = cmd("", "status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+\d+\s+21\s+12\s+\S+\s+0\s+3\s+paused, behind$`, r.stdout)
			require.Regexp(t, `(?m)^plain\s+21\s+21\s+0\s+0s\s+0\s+-\s+caught up$`, r.stdout)
			require.Regexp(t, "(?m)^paused: orders everywhere since \\S+Z: bad deploy 4\\.2 \\(`subscriptions resume orders` lifts it\\)$", r.stdout)
			r = cmd("", "status", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			var listed struct {
				Subscribers []struct {
					Subscriber  string
					State       string
					Paused      bool
					PausedAt    time.Time `json:"paused_at"`
					PauseReason string    `json:"pause_reason"`
				}
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed), r.stdout)
			require.Len(t, listed.Subscribers, 2)
			got := listed.Subscribers[0]
			require.Equal(t, "orders", got.Subscriber)
			require.Equal(t, "behind", got.State, "JSON keeps the position's state beside paused")
			require.True(t, got.Paused)
			require.Equal(t, "bad deploy 4.2", got.PauseReason)
			require.False(t, got.PausedAt.IsZero())
			require.False(t, listed.Subscribers[1].Paused, "plain")

			r = cmd("", "-json", "pause", "orders", "-reason", "another")
			require.Equal(t, 0, r.code, r.stderr)
			require.JSONEq(t, fmt.Sprintf(`{"subscriber":"orders","paused":true,"paused_at":%q,"reason":"bad deploy 4.2"}`, got.PausedAt.Format(time.RFC3339Nano)), r.stdout,
				"a paused name keeps its first pause, without a question")

			r = cmd("no\n", "resume", "orders")
			require.Equal(t, exitDeclined, r.code, r.stderr)
			require.Regexp(t, `Resume subscriber "orders", paused since \S+Z: bad deploy 4\.2\? Its replicas, in every process, go on from their checkpoints\.`, r.stderr)
			require.Equal(t, before, counts.count("orders"))
			r = cmd("", "-yes", "-json", "resume", "orders")
			require.Equal(t, 0, r.code, r.stderr)
			require.JSONEq(t, `{"subscriber":"orders","paused":false}`, r.stdout)
			require.Contains(t, r.stderr, "subscriber resumed")
			caughtUp(orders[0].sub)
			r = cmd("", "resume", "orders")
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, "subscriber \"orders\" is not paused\n", r.stdout)
			r = cmd("", "status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+21\s+21\s+0\s+0s\s+0\s+3\s+caught up$`, r.stdout)
			require.NotContains(t, r.stdout, "paused")

			all, err := events.ReadAfter(ctx, 0, 100)
			require.NoError(t, err)
			require.Len(t, all, 21)
			counts.mu.Lock()
			for _, name := range []string{"orders", "plain"} {
				for _, ev := range all {
					require.Equal(t, 1, counts.calls[name][ev.ID], "%s: event at %d", name, ev.Position)
				}
			}
			counts.mu.Unlock()

			for _, bad := range []struct {
				args []string
				code int
				msg  string
			}{
				{[]string{"pause"}, exitUsage, "pause: want one SUBSCRIBER, got 0 arguments"},
				{[]string{"resume", "a", "b"}, exitUsage, "resume: want one SUBSCRIBER, got 2 arguments"},
				{[]string{"resume", "orders", "-reason", "x"}, exitUsage, "flag provided but not defined: -reason"},
				{[]string{"pause", "nobody", "-yes"}, exitError, `no subscriber "nobody"`},
				{[]string{"pause", "orders/partition-0-of-3", "-yes"}, exitError, `name the subscriber, "orders"`},
				{[]string{"resume", "orders/partitions", "-yes"}, exitError, `name the subscriber, "orders"`},
			} {
				r = cmd("", bad.args...)
				require.Equal(t, bad.code, r.code, "%v: %s", bad.args, r.stderr)
				require.Contains(t, r.stderr, bad.msg, bad.args)
			}
			st, err = orders[0].sub.Status(ctx)
			require.NoError(t, err)
			require.False(t, st.Paused, "no refused command paused anything")
		})
	}
}
