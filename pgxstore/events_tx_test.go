package pgxstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// TestAppendTx covers an append inside the caller's transaction (a unit
// of work): the events commit and roll back with the caller's own writes,
// a refused append leaves the caller's transaction usable, and the
// transaction must run at READ COMMITTED.
func TestAppendTx(t *testing.T) {
	t.Parallel()
	pg, pool := newDatabase(t)
	ctx := testCtx(t)
	store := newEventStoreOn(t, pg)
	_, err := pool.Exec(ctx, "CREATE TABLE accounts (id text PRIMARY KEY, owner text NOT NULL)")
	require.NoError(t, err)
	feed := func() []domain.EventEnvelope[any] {
		t.Helper()
		evs, err := store.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		return evs
	}
	accounts := func() (n int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n))
		return n
	}

	t.Run("commit and rollback", func(t *testing.T) {
		opened := feedtest.NewEvent("acc-1", "account.opened", "ann")
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO accounts VALUES ('acc-1', 'ann')")
		require.NoError(t, err)
		require.NoError(t, store.AppendTx(ctx, tx, "acc-1", 0, opened))
		require.Empty(t, feed(), "not visible before the caller commits")
		require.NoError(t, tx.Commit(ctx))
		got := feed()
		require.Len(t, got, 1)
		require.Equal(t, opened.ID, got[0].ID)
		require.Equal(t, 1, got[0].SequenceNo)
		require.Equal(t, 1, accounts())

		tx, err = pool.BeginTx(ctx, pgx.TxOptions{})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO accounts VALUES ('acc-2', 'bob')")
		require.NoError(t, err)
		require.NoError(t, store.AppendTx(ctx, tx, "acc-2", 0, feedtest.NewEvent("acc-2", "account.opened", "bob")))
		require.NoError(t, tx.Rollback(ctx))
		require.Len(t, feed(), 1, "rolled back with the caller's row")
		require.Equal(t, 1, accounts())
	})

	t.Run("refused append leaves the transaction usable", func(t *testing.T) {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "INSERT INTO accounts VALUES ('acc-3', 'cy')")
		require.NoError(t, err)
		err = store.AppendTx(ctx, tx, "acc-1", 0, feedtest.NewEvent("acc-1", "account.renamed", "x"))
		require.ErrorIs(t, err, domain.ErrConcurrencyConflict)
		stored := feed()[0]
		err = store.AppendTx(ctx, tx, "acc-1", 0, stored)
		require.ErrorIs(t, err, domain.ErrAlreadyAppended, "the retry of an append that committed")
		require.ErrorIs(t, store.AppendTx(ctx, tx, "acc-1", 0), domain.ErrConcurrencyConflict, "an empty append still answers its version check")
		require.ErrorIs(t, store.AppendTx(ctx, tx, "", 0, feedtest.NewEvent("", "x", nil)), domain.ErrInvalidEvent)
		require.NoError(t, store.AppendTx(ctx, tx, "acc-1", 1, feedtest.NewEvent("acc-1", "account.renamed", "ann b")))
		require.NoError(t, tx.Commit(ctx))
		got := feed()
		require.Len(t, got, 2)
		require.Equal(t, 2, got[1].SequenceNo)
		require.Equal(t, 2, accounts())
	})

	t.Run("needs READ COMMITTED", func(t *testing.T) {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		err = store.AppendTx(ctx, tx, "acc-9", 0, feedtest.NewEvent("acc-9", "account.opened", "z"))
		require.ErrorIs(t, err, pgevents.ErrNotReadCommitted)
		var one int
		require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is still usable")
		require.ErrorContains(t, store.AppendTx(ctx, nil, "acc-9", 0), "nil transaction")
	})
}

// TestAppendTxKeepsTheFeedInOrder: an append behind an open unit of work
// waits for it, and takes the position after its events, so a reader
// never sees a position while a smaller one can still commit.
func TestAppendTxKeepsTheFeedInOrder(t *testing.T) {
	t.Parallel()
	pg, pool := newDatabase(t)
	ctx := testCtx(t)
	store := newEventStoreOn(t, pg)
	other := newGormEventStore(t, pg) // another process, the other backend

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	first := feedtest.NewEvent("uow", "first", 1)
	require.NoError(t, store.AppendTx(ctx, tx, "uow", 0, first))

	done := make(chan error, 2)
	go func() { done <- store.Append(ctx, "plain", 0, feedtest.NewEvent("plain", "second", 2)) }()
	go func() { done <- other.Append(ctx, "gorm", 0, feedtest.NewEvent("gorm", "second", 3)) }()
	feedtest.Eventually(t, "both appends wait for the append lock", func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&waiting))
		return waiting == 2
	})
	got, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "nothing is visible while the unit of work is open")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	got, err = store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, first.ID, got[0].ID, "the unit of work's event takes the first position")
	require.Equal(t, int64(1), got[0].Position)
}

// TestAppendTxFromAHandler: a handler that raises events (a process
// manager) appends them through its batch transaction, so they commit
// with its checkpoint: once each, though the first attempt fails after
// the append and is rolled back.
func TestAppendTxFromAHandler(t *testing.T) {
	t.Parallel()
	pg, pool := newDatabase(t)
	ctx := testCtx(t)
	store := newEventStoreOn(t, pg)
	cps := newCheckpointStore(t, pool)
	const orders = 5
	for i := range orders {
		id := feedtest.UniqueID("order")
		require.NoError(t, store.Append(ctx, id, 0, feedtest.NewEvent(id, "order.placed", i)))
	}
	var failed atomic.Bool
	handler := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		if e.EventType != "order.placed" {
			return nil
		}
		tx := pgxstore.TxFromContext(ctx)
		if err := store.AppendTx(ctx, tx, e.AggregateID, e.SequenceNo, feedtest.NewEvent(e.AggregateID, "invoice.requested", nil)); err != nil {
			return err
		}
		if !failed.Swap(true) {
			return errors.New("fails once, after its append")
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber("invoicing", store, cps, handler,
		subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(rctx) }()
	feedtest.Eventually(t, "an invoice per order, handled too", func() bool {
		pos, err := cps.Position(ctx, "invoicing")
		require.NoError(t, err)
		return pos == 2*orders
	})
	cancel()
	require.NoError(t, <-done)
	got, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 2*orders)
	invoices := map[string]int{}
	for _, e := range got {
		if e.EventType == "invoice.requested" {
			invoices[e.AggregateID]++
			require.Equal(t, 2, e.SequenceNo)
		}
	}
	require.Len(t, invoices, orders)
	for agg, n := range invoices {
		require.Equal(t, 1, n, agg)
	}
}
