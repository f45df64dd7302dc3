package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// partitionedState fills db with a partitioned subscriber's state: "orders"
// with 3 partitions ran over the first events (one of them parked) and
// stopped; then more events were appended. It returns the expected lag of
// each partition and the feed head.
func partitionedState(t *testing.T, db *gorm.DB) (lags []int64, head int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	parking, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)
	versions := map[string]int{}
	appendOne := func(aggregate, eventType string) {
		env := domain.NewEventEnvelope[any](map[string]any{"n": versions[aggregate]}, aggregate, eventType, 0)
		require.NoError(t, events.Append(ctx, aggregate, versions[aggregate], env))
		versions[aggregate]++
	}
	for i := range 12 {
		typ := "order.placed"
		if i == 7 {
			typ = "order.bad"
		}
		appendOne(fmt.Sprintf("order-%d", i%6), typ)
	}

	const n = 3
	sub, err := subscriptions.NewSubscriber("orders", events, checkpoints, func(_ context.Context, ev domain.EventEnvelope[any]) error {
		if ev.EventType == "order.bad" {
			return errors.New("cannot handle a bad order")
		}
		return nil
	}, subscriptions.WithPartitions(n), subscriptions.WithParkingLot(parking), subscriptions.WithMaxRetries(0),
		subscriptions.WithPollInterval(20*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	require.Eventually(t, func() bool {
		st, err := sub.Status(ctx)
		return err == nil && st.Lag == 0 && st.Parked == 1
	}, time.Minute, 20*time.Millisecond, "the partitioned subscriber did not catch up")
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Run did not return")
	}

	lags = make([]int64, n)
	for i := range 5 {
		aggregate := fmt.Sprintf("order-%d", i)
		appendOne(aggregate, "order.placed")
		lags[subscriptions.PartitionOf(aggregate, n)]++
	}
	head, err = events.HeadPosition(ctx)
	require.NoError(t, err)
	return lags, head
}

// cliDatabases are the databases the command tests run on, each opened
// for the test with the DSN the command is given: a SQLite file and a
// Postgres schema.
var cliDatabases = []struct {
	name string
	open func(t *testing.T) (*gorm.DB, string)
}{
	{"sqlite", func(t *testing.T) (*gorm.DB, string) {
		path := filepath.Join(t.TempDir(), "orders.db")
		return dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(path)), path
	}},
	{"postgres", func(t *testing.T) (*gorm.DB, string) {
		pg := dbtest.NewPostgres(t)
		return pg.DB, pg.DSN
	}},
}

// TestPartitionedSubscriber: status shows a partitioned subscriber as one
// row (with -partitions and -json its partitions too), parked list takes
// its name, reset moves every partition and refuses a position beyond the
// head: on a SQLite file and on Postgres.
func TestPartitionedSubscriber(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	for _, c := range cliDatabases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, dsn := c.open(t)
			lags, head := partitionedState(t, db)
			var total int64
			for _, l := range lags {
				total += l
			}
			run := func(args ...string) result {
				return runCLI(t, cli, "", nil, append([]string{"-dsn", dsn}, args...)...)
			}

			r := run("status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^SUBSCRIBER\s+POSITION\s+HEAD\s+LAG\s+LAG_TIME\s+PARKED\s+PARTITIONS\s+STATE$`, r.stdout)
			require.Regexp(t, fmt.Sprintf(`(?m)^orders\s+\d+\s+%d\s+%d\s+\S+\s+1\s+3\s+behind$`, head, total), r.stdout)
			require.NotContains(t, r.stdout, "partition-", "the partitions' rows are not subscribers")

			r = run("status", "-partitions")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, fmt.Sprintf(`(?m)^orders\s+\d+\s+%d\s+%d\s+\S+\s+1\s+3\s+behind$`, head, total), r.stdout)
			for p, lag := range lags {
				require.Regexp(t, fmt.Sprintf(`(?m)^orders/partition-%d-of-3\s+\d+\s+%d\s+%d\s+\S+\s+-\s+%d of 3\s+`, p, head, lag, p), r.stdout)
			}

			r = run("status", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			var st struct {
				Subscribers []struct {
					Subscriber           string
					Position, Head, Lag  int64
					Parked, Partitions   int
					PartitionCheckpoints []jsonPartition `json:"partition_checkpoints"`
				}
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
			require.Len(t, st.Subscribers, 1)
			got := st.Subscribers[0]
			require.Equal(t, "orders", got.Subscriber)
			require.Equal(t, 3, got.Partitions)
			require.Equal(t, 1, got.Parked)
			require.Equal(t, total, got.Lag)
			require.Len(t, got.PartitionCheckpoints, 3)
			lowest := head
			for p, pc := range got.PartitionCheckpoints {
				require.Equal(t, p, pc.Partition)
				require.Equal(t, fmt.Sprintf("orders/partition-%d-of-3", p), pc.Checkpoint)
				require.Equal(t, lags[p], pc.Lag, "partition %d", p)
				if pc.Lag > 0 {
					lowest = min(lowest, pc.Position)
				}
			}
			require.Equal(t, lowest, got.Position, "the lowest checkpoint of a partition with events left")

			r = run("parked", "list", "-subscriber", "orders")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+8\s+\S+\s+order\.bad\s+order-1\s+1\s+`, r.stdout)
			r = run("parked", "list")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^orders\s+8\s+`, r.stdout)
			ids := regexp.MustCompile(`(?m)^orders\s+8\s+(\S+)`).FindStringSubmatch(r.stdout)
			require.NotNil(t, ids)
			r = run("parked", "show", "-subscriber", "orders", ids[1])
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, "cannot handle a bad order")
			r = run("-json", "parked", "show", ids[1])
			require.Equal(t, 0, r.code, r.stderr)
			var shown struct {
				Parked struct {
					Subscriber string
					Error      string
				}
				Event struct {
					EventType string `json:"event_type"`
				}
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown), r.stdout)
			require.Equal(t, "orders", shown.Parked.Subscriber)
			require.Equal(t, "order.bad", shown.Event.EventType)

			for _, bad := range []struct {
				args []string
				msg  string
			}{
				{[]string{"parked", "list", "-subscriber", "orders/partition-0-of-3"}, `name the subscriber, "orders"`},
				{[]string{"reset", "orders/partition-1-of-3", "0", "-yes"}, `name the subscriber, "orders"`},
				{[]string{"reset", "orders/partitions", "0", "-yes"}, `name the subscriber, "orders"`},
				{[]string{"reset", "orders", fmt.Sprint(head + 1), "-yes"}, fmt.Sprintf("position %d is beyond the feed head %d", head+1, head)},
			} {
				r = run(bad.args...)
				require.Equal(t, 1, r.code, "%v: %s", bad.args, r.stderr)
				require.Contains(t, r.stderr, bad.msg, bad.args)
			}

			r = run("-json", "-yes", "parked", "discard", ids[1])
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, `"discarded"`)
			require.Contains(t, r.stderr, "parked event discarded", "the audit line")
			r = run("status", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, `"parked": 0`)

			r = run("reset", "orders", "2", "-json", "-yes")
			require.Equal(t, 0, r.code, r.stderr)
			require.JSONEq(t, fmt.Sprintf(`{"subscriber":"orders","from":%d,"position":2,"partitions":3}`, minPosition(t, got.PartitionCheckpoints)), r.stdout)
			r = run("status", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
			for _, pc := range st.Subscribers[0].PartitionCheckpoints {
				require.Equal(t, int64(2), pc.Position, "every partition was reset")
			}
			require.Equal(t, int64(2), st.Subscribers[0].Position)

			// A row this version refuses (a partition count past
			// MaxPartitions): its subscriber's row says why, the others are
			// still shown.
			require.NoError(t, db.Exec("INSERT INTO subscriber_checkpoints (subscriber, position, updated_at) VALUES (?, ?, ?)",
				"broken/partitions", subscriptions.MaxPartitions+1, time.Now().UTC()).Error)
			r = run("status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^broken\s+0\s+0\s+0\s+0s\s+0\s+1025\s+error: .*partitions 1025 must be between`, r.stdout)
			require.Regexp(t, `(?m)^orders\s+2\s+`, r.stdout)
			r = run("status", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, "partitions 1025 must be between 1 and 1024 (WithPartitions)", "JSON has the whole error")
		})
	}
}

// jsonPartition is a partition of status -json.
type jsonPartition struct {
	Partition  int
	Checkpoint string
	Position   int64
	Lag        int64
}

func minPosition(t *testing.T, ps []jsonPartition) int64 {
	t.Helper()
	require.NotEmpty(t, ps)
	lo := ps[0].Position
	for _, p := range ps {
		lo = min(lo, p.Position)
	}
	return lo
}
