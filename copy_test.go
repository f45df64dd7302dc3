package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// copyEvents writes events' (event_id, position) into table with COPY
// through the batch transaction of e's backend: subscriptions.CopyFrom
// on GORM, the pgx.Tx's CopyFrom on pgx.
func copyEvents(ctx context.Context, e *env, table string, events []domain.EventEnvelope[any]) error {
	rows := make([][]any, len(events))
	for i, ev := range events {
		rows[i] = []any{ev.ID, ev.Position}
	}
	var (
		n   int64
		err error
	)
	if e.Pgx != nil {
		tx := pgxstore.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no batch transaction")
		}
		n, err = tx.CopyFrom(ctx, pgx.Identifier{table}, []string{"event_id", "position"}, pgx.CopyFromRows(rows))
	} else {
		n, err = subscriptions.CopyFrom(ctx, pgx.Identifier{table}, []string{"event_id", "position"}, pgx.CopyFromRows(rows))
	}
	if err == nil && n != int64(len(rows)) {
		err = fmt.Errorf("copied %d rows of %d", n, len(rows))
	}
	return err
}

// TestCopyFromRebuild: a batch handler that writes its rows with COPY
// through the batch transaction, on every database backend (COPY on
// Postgres, GORM's and pgx's; INSERTs on SQLite): the rows commit with
// the checkpoint, each event's once (the projection's primary key refuses
// a second), and a batch the handler fails after its COPY is rolled back
// with its rows, then handled one event at a time, each copied once.
func TestCopyFromRebuild(t *testing.T) {
	t.Parallel()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			createProjection(t, e.DB, "copied")
			const n = 45
			ids := appendN(t, e.Events, "copy.test", 0, n)
			var calls, failed atomic.Int64
			handler := func(ctx context.Context, events []domain.EventEnvelope[any]) error {
				calls.Add(1)
				if err := copyEvents(ctx, e, "copied", events); err != nil {
					return err
				}
				// The second batch fails after its COPY: its rows must go
				// with its transaction.
				if len(events) > 1 && events[0].Position > 20 && failed.CompareAndSwap(0, 1) {
					return errors.New("failed after the COPY")
				}
				return nil
			}
			sub, err := subscriptions.NewSubscriber("copy-rebuild", e.Events, e.Checkpoints, nil,
				subscriptions.WithBatchHandler(handler), subscriptions.WithBatchSize(20),
				subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			run := start(t, sub)
			waitCaughtUp(t, sub)
			run.stop(t)
			require.Equal(t, int64(1), failed.Load(), "one batch failed after its COPY")
			require.Greater(t, calls.Load(), int64(3), "the failed batch's events were handled again")
			require.Equal(t, ids, projected(t, e.DB, "copied"), "every event's row, once, in feed order")
			pos, err := e.Checkpoints.Position(context.Background(), "copy-rebuild")
			require.NoError(t, err)
			require.Equal(t, int64(n), pos)
		})
	}
}

// TestCopyFromInBatch: CopyFrom writes in a GormCheckpointStore batch's
// transaction, whichever way the batch began (Acquire, or AcquireAfter's
// pipelined round trip on Postgres): nothing is visible to others before
// the commit, a rollback discards the rows, a commit keeps them with the
// checkpoint. Outside a batch it refuses with ErrNoBatchTx; on Postgres,
// in a batch whose transaction a handler's statement ended, it refuses
// with ErrBatchTxEnded instead of writing in autocommit.
func TestCopyFromInBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rows := func(ids ...string) pgx.CopyFromSource {
		r := make([][]any, len(ids))
		for i, id := range ids {
			r[i] = []any{id, int64(i + 1)}
		}
		return pgx.CopyFromRows(r)
	}
	cols := []string{"event_id", "position"}
	for _, b := range gormEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			createProjection(t, e.DB, "copied")
			count := func() int64 {
				var n int64
				require.NoError(t, e.DB.Raw("SELECT COUNT(*) FROM copied").Scan(&n).Error)
				return n
			}
			_, err := subscriptions.CopyFrom(ctx, pgx.Identifier{"copied"}, cols, rows("x"))
			require.ErrorIs(t, err, subscriptions.ErrNoBatchTx)

			acquire := func(name string) subscriptions.Batch {
				batch, ok, err := e.Checkpoints.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, ok)
				return batch
			}
			batch := acquire("copy-batch")
			n, err := subscriptions.CopyFrom(batch.HandlerContext(ctx), pgx.Identifier{"copied"}, cols, rows("a", "b"))
			require.NoError(t, err)
			require.Equal(t, int64(2), n)
			if e.Postgres() {
				require.Zero(t, count(), "not visible before the commit")
			}
			require.NoError(t, batch.Rollback())
			require.Zero(t, count(), "rolled back with the batch")

			batch = acquire("copy-batch")
			_, err = subscriptions.CopyFrom(batch.HandlerContext(ctx), pgx.Identifier{"copied"}, cols, rows("a", "b"))
			require.NoError(t, err)
			require.NoError(t, batch.Commit(ctx, 2))
			require.Equal(t, int64(2), count(), "committed with the checkpoint")

			// A duplicate fails the write, and tells which way it went.
			batch = acquire("copy-batch")
			_, err = subscriptions.CopyFrom(batch.HandlerContext(ctx), pgx.Identifier{"copied"}, cols, rows("a"))
			require.Error(t, err)
			if e.Postgres() {
				require.NotContains(t, err.Error(), "as INSERTs", "COPY on Postgres through pgx")
			} else {
				require.Contains(t, err.Error(), "as INSERTs")
			}
			require.NoError(t, batch.Rollback())

			if fa, ok := e.Checkpoints.(subscriptions.FeedAcquirer); ok && e.Postgres() {
				ids := appendN(t, e.Events, "copy.test", 0, 3)
				batch, _, ok, err := fa.AcquireAfter(ctx, "copy-batch", 2, 10)
				require.NoError(t, err)
				require.True(t, ok, "the pipelined acquire took the row")
				_, err = subscriptions.CopyFrom(batch.HandlerContext(ctx), pgx.Identifier{"copied"}, cols, rows(ids...))
				require.NoError(t, err)
				require.NoError(t, batch.Rollback())
				require.Equal(t, int64(2), count(), "rolled back with the pipelined batch")
			}
			if !e.Postgres() {
				return
			}
			batch = acquire("copy-batch")
			hctx := batch.HandlerContext(ctx)
			require.NoError(t, subscriptions.TxFromContext(hctx).Exec("COMMIT").Error, "a handler's statement ends the transaction")
			_, err = subscriptions.CopyFrom(hctx, pgx.Identifier{"copied"}, cols, rows("late"))
			require.ErrorIs(t, err, subscriptions.ErrBatchTxEnded)
			require.NoError(t, batch.Rollback())
			require.Equal(t, int64(2), count(), "nothing written outside the transaction")
		})
	}
}

// TestExampleCopyFrom runs ExampleCopyFrom against the test server and
// checks what it prints.
func TestExampleCopyFrom(t *testing.T) {
	dbtest.RequirePostgres(t)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = w
	func() {
		defer func() { os.Stdout = stdout }()
		ExampleCopyFrom()
	}()
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, "3 deposits, 60.00 in all\n", string(out))
}
