package pgxstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/pgxstore"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// newCheckpointStore is a CheckpointStore on pool.
func newCheckpointStore(t testing.TB, pool *pgxpool.Pool) *pgxstore.CheckpointStore {
	t.Helper()
	s, err := pgxstore.NewCheckpointStore(testCtx(t), pool)
	require.NoError(t, err)
	return s
}

// inTx reports whether ctx carries a usable pgxstore transaction.
func inTx(ctx context.Context) bool {
	tx := pgxstore.TxFromContext(ctx)
	if tx == nil {
		return false
	}
	var one int
	return tx.QueryRow(ctx, "SELECT 1").Scan(&one) == nil && one == 1
}

// TestCheckpointStoreContract runs the CheckpointStore suite (and the
// suites of its capabilities: CheckpointResetter, Pauser) against the pgx
// store, the competing store on a second pool as another process's.
func TestCheckpointStoreContract(t *testing.T) {
	subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
		Name:     "pgx",
		Parallel: true,
		New: func(t *testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
			pg, pool := newDatabase(t)
			return newCheckpointStore(t, pool), newCheckpointStore(t, pg.OpenPgx(t))
		},
		Transactional: true,
		InTx:          inTx,
	})
}

// TestBatchFailureContract runs the batch-failure suite: a handler's
// COMMIT statement ends the batch's transaction, and a deferred foreign
// key makes its commit fail.
func TestBatchFailureContract(t *testing.T) {
	subscriptionstest.RunBatchFailureSuite(t, subscriptionstest.BatchFailureHarness{
		Name: "pgx",
		New: func(t *testing.T) subscriptions.CheckpointStore {
			_, pool := newDatabase(t)
			ctx := testCtx(t)
			_, err := pool.Exec(ctx, "CREATE TABLE fc_parent (id integer PRIMARY KEY)")
			require.NoError(t, err)
			_, err = pool.Exec(ctx, "CREATE TABLE fc_child (pid integer REFERENCES fc_parent (id) DEFERRABLE INITIALLY DEFERRED)")
			require.NoError(t, err)
			return newCheckpointStore(t, pool)
		},
		EndTx: func(t *testing.T, ctx context.Context) {
			_, _ = pgxstore.TxFromContext(ctx).Exec(ctx, "COMMIT") // swallowed, as a careless handler would
		},
		FailCommit: func(t *testing.T, ctx context.Context) {
			_, err := pgxstore.TxFromContext(ctx).Exec(ctx, "INSERT INTO fc_child (pid) VALUES (42)")
			require.NoError(t, err)
		},
	})
}

// TestFeedSharerContract runs the FeedSharer suite: batches read the pgx
// event store on the same pool in their transaction, and AcquireAfter
// reads what ReadAfter reads; a memory store is foreign.
func TestFeedSharerContract(t *testing.T) {
	subscriptionstest.RunFeedSharerSuite(t, subscriptionstest.FeedSharerHarness{
		Name: "pgx",
		New: func(t *testing.T) (subscriptions.CheckpointStore, domain.EventStore, domain.EventStore) {
			_, pool := newDatabase(t)
			events, err := pgxstore.NewEventStore(testCtx(t), pool)
			require.NoError(t, err)
			return newCheckpointStore(t, pool), events, infrastructure.NewMemoryStore()
		},
	})
}
