package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRepartitionCommand: repartition refuses, changing nothing, while a
// partition lags behind the highest checkpoint (the CLI has no handler to
// bring it there), asks first, then moves "orders" from 3 partitions to 2
// (status shows 2 partitions at the highest checkpoint, the old rows as
// retired) and to unpartitioned; usage mistakes exit 2: on a SQLite file
// and on Postgres.
func TestRepartitionCommand(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	for _, c := range cliDatabases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, dsn := c.open(t)
			lags, _ := partitionedState(t, db)
			var total int64
			for _, l := range lags {
				total += l
			}
			run := func(stdin string, args ...string) result {
				return runCLI(t, cli, stdin, nil, append([]string{"-dsn", dsn}, args...)...)
			}
			type status struct {
				Subscribers []struct {
					Subscriber           string
					Lag                  int64
					Partitions           int
					PartitionCheckpoints []jsonPartition `json:"partition_checkpoints"`
					OtherCheckpoints     []string        `json:"other_checkpoints"`
				}
			}
			readStatus := func() status {
				r := run("", "status", "-json")
				require.Equal(t, 0, r.code, r.stderr)
				var st status
				require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
				require.Len(t, st.Subscribers, 1)
				return st
			}
			before := readStatus().Subscribers[0]
			var target int64
			for _, pc := range before.PartitionCheckpoints {
				target = max(target, pc.Position)
			}

			for _, bad := range []struct {
				args []string
				msg  string
			}{
				{[]string{"repartition", "orders"}, "-partitions N is required"},
				{[]string{"repartition", "-partitions", "2"}, "want SUBSCRIBER -partitions N, got 0 arguments"},
				{[]string{"repartition", "orders", "-partitions", "1025"}, "from 0 (unpartitioned) to 1024"},
			} {
				r := run("", bad.args...)
				require.Equal(t, 2, r.code, "%v: %s", bad.args, r.stderr)
				require.Contains(t, r.stderr, bad.msg, bad.args)
			}
			r := run("", "repartition", "orders", "-partitions", "3", "-yes")
			require.Equal(t, 1, r.code, r.stderr)
			require.Contains(t, r.stderr, "is 3 partitions already")

			// A partition behind the others (moved back to 0 from below the
			// highest checkpoint, so that it has events below it): refused,
			// nothing changed.
			low := -1
			for p, pc := range before.PartitionCheckpoints {
				if pc.Position > 0 && pc.Position < target && (low < 0 || pc.Position < before.PartitionCheckpoints[low].Position) {
					low = p
				}
			}
			require.GreaterOrEqual(t, low, 0, "a partition below the highest checkpoint: %v", before.PartitionCheckpoints)
			lagging := before.PartitionCheckpoints[low].Checkpoint
			require.NoError(t, db.Exec("UPDATE subscriber_checkpoints SET position = 0 WHERE subscriber = ?", lagging).Error)
			r = run("", "repartition", "orders", "-partitions", "2", "-yes")
			require.Equal(t, 1, r.code, r.stderr)
			require.Contains(t, r.stderr, "lag behind the highest checkpoint")
			require.Contains(t, r.stderr, "nothing was changed")
			require.Equal(t, 3, readStatus().Subscribers[0].Partitions)
			require.NoError(t, db.Exec("UPDATE subscriber_checkpoints SET position = ? WHERE subscriber = ?", before.PartitionCheckpoints[low].Position, lagging).Error)

			r = run("no\n", "repartition", "orders", "-partitions", "2")
			require.Equal(t, 3, r.code, r.stderr)
			require.Contains(t, r.stderr, `Repartition subscriber "orders" from 3 partitions to 2 partitions?`)
			require.Equal(t, 3, readStatus().Subscribers[0].Partitions)

			r = run("", "-yes", "-json", "repartition", "orders", "-partitions", "2")
			require.Equal(t, 0, r.code, r.stderr)
			require.JSONEq(t, fmt.Sprintf(`{"subscriber":"orders","from":3,"partitions":2,"position":%d}`, target), r.stdout)
			require.Regexp(t, `subscriber repartitioned.* by=cli:\S+`, r.stderr, "the audit line names the operator")
			after := readStatus().Subscribers[0]
			require.Equal(t, 2, after.Partitions)
			require.Len(t, after.PartitionCheckpoints, 2)
			for _, pc := range after.PartitionCheckpoints {
				require.Equal(t, target, pc.Position, "every new partition at the highest old checkpoint")
			}
			require.Equal(t, total, after.Lag, "the events appended after the stop are still to handle")
			require.Equal(t, []string{"orders/partition-0-of-3", "orders/partition-1-of-3", "orders/partition-2-of-3"}, after.OtherCheckpoints)
			r = run("", "status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, fmt.Sprintf(`(?m)^orders\s+\d+\s+\d+\s+%d\s+\S+\s+1\s+2\s+behind$`, total), r.stdout)
			require.Contains(t, r.stdout, "retired by a repartition")

			r = run("", "repartition", "orders", "-partitions", "0", "-yes")
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, fmt.Sprintf(`repartitioned: subscriber "orders" from 2 partitions to unpartitioned at position %d`, target))
			plain := readStatus().Subscribers[0]
			require.Zero(t, plain.Partitions)
			require.Equal(t, total, plain.Lag)
			require.Len(t, plain.OtherCheckpoints, 5, "both retired layouts")
		})
	}
}
