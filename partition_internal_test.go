package subscriptions

import (
	"context"
	"fmt"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/dialect"
)

// TestPartitionChildSharesTheConfiguration: a partition's Subscriber
// shares its parent's configuration (no copy to keep in step) and has its
// own name, feed view and live state, and no partitions of its own.
func TestPartitionChildSharesTheConfiguration(t *testing.T) {
	parent, err := NewSubscriber("parent", infrastructure.NewMemoryStore(), NewMemoryCheckpointStore(),
		func(context.Context, domain.EventEnvelope[any]) error { return nil },
		WithPartitions(4), WithConcurrency(2), WithBatchSize(7), WithMaxRetries(1), WithParkingLot(NewMemoryParkingLot()))
	require.NoError(t, err)
	tels := parent.tel.partitions(4)
	child := parent.partitionChild(partitionName("parent", 2, 4), 2, nil, tels[2])
	require.Same(t, parent.config, child.config)
	require.Equal(t, 7, child.batchSize)
	require.Equal(t, 2, child.retry.attempts())
	require.Zero(t, child.partitions)
	require.Zero(t, child.concurrency)
	require.Same(t, tels[2], child.tel)
	require.NotSame(t, parent.tel, child.tel)
	lot, ok := child.parking.(partitionLot)
	require.True(t, ok, "parks under the parent's name")
	require.Equal(t, "parent", lot.name)
}

// TestPartitionOfMatchesSQL: the Go hash and the SQL filter assign every
// aggregate ID the same partition (ASCII, UTF-8, empty, long IDs), so the
// coordinator's probe marks the partition whose read will return the event.
func TestPartitionOfMatchesSQL(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	ids := []string{"", "acc-1", "ünïcödé-äggregate", "日本語", strings.Repeat("x", 1000)}
	for i := range 200 {
		ids = append(ids, fmt.Sprintf("agg-%d", i), uuid.NewString())
	}
	for _, n := range []int{1, 3, 8, 16, 1024} {
		for _, id := range ids {
			var got int
			if err := pg.DB.Raw("SELECT mod("+dialect.MD5PartitionHash+", ?) FROM (SELECT ?::text AS aggregate_id) AS e", n, id).Scan(&got).Error; err != nil {
				t.Fatal(err)
			}
			if want := PartitionOf(id, n); got != want {
				t.Fatalf("aggregate %q, %d partitions: SQL says %d, Go %d", id, n, got, want)
			}
		}
	}
}

// TestAcquireLockAndCheck: Acquire tells a row another transaction holds
// (not acquired, and not created again) from a missing one (created and
// acquired), in its lock statement (lockRow), and the batch holds the
// position.
func TestAcquireLockAndCheck(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	ctx := t.Context()
	store, err := NewGormCheckpointStore(pg.DB)
	require.NoError(t, err)

	// Missing: created at 0 and acquired.
	first, ok, err := store.Acquire(ctx, "parts/partition-0-of-2")
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 0, first.Position())

	// Held by another process's transaction (another store on its own
	// pool, as a replica would be): skipped.
	other, err := NewGormCheckpointStore(pg.Open(t))
	require.NoError(t, err)
	_, ok, err = other.Acquire(ctx, "parts/partition-0-of-2")
	require.NoError(t, err)
	require.False(t, ok)

	require.NoError(t, first.Commit(ctx, 7))
	again, ok, err := other.Acquire(ctx, "parts/partition-0-of-2")
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 7, again.Position())
	require.NoError(t, again.Rollback())
}
