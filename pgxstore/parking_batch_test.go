package pgxstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// listedIDs is the subscriber's parked event IDs as lot lists them.
func listedIDs(t *testing.T, lot subscriptions.ParkingLot, subscriber string) []string {
	t.Helper()
	got, err := lot.List(testCtx(t), subscriber)
	require.NoError(t, err)
	out := []string{}
	for _, p := range got {
		out = append(out, p.EventID)
	}
	return out
}

// TestParkingLotJoinsTheBatchTransaction: with a batch transaction of the
// lot's database in the context (as the checkpoint store's batches put
// it), Park, Purge, ClearDelivered and ClearPartitionDelivered write
// through it and commit or roll back with it; a transaction of another
// database is ignored and the write commits on its own.
func TestParkingLotJoinsTheBatchTransaction(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	lot, pg, pool := newLot(t)
	entry := func(id string, position int64) subscriptions.ParkedEvent {
		return subscriptions.ParkedEvent{Subscriber: "batch", EventID: id, Position: position, AggregateID: "agg-" + id, Error: "x", Attempts: 1}
	}
	// inBatch runs fn with a batch transaction of pool in its context and
	// commits it when commit, else rolls it back.
	inBatch := func(t *testing.T, commit bool, fn func(bctx context.Context)) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		bctx := pgxstore.WithBatchTx(ctx, tx, pool)
		require.True(t, lot.ClearsInBatch(bctx))
		fn(bctx)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
	}
	require.False(t, lot.ClearsInBatch(ctx), "no transaction in the context")

	inBatch(t, false, func(bctx context.Context) {
		require.NoError(t, lot.Park(bctx, entry("ev-1", 1)))
		require.Empty(t, listedIDs(t, lot, "batch"), "the parking is not committed before the batch")
	})
	require.Empty(t, listedIDs(t, lot, "batch"), "a rolled-back batch parks nothing")
	inBatch(t, true, func(bctx context.Context) {
		for i, id := range []string{"ev-1", "ev-2", "ev-3", "ev-4"} {
			require.NoError(t, lot.Park(bctx, entry(id, int64(i+1))))
		}
	})
	require.Equal(t, []string{"ev-1", "ev-2", "ev-3", "ev-4"}, listedIDs(t, lot, "batch"))

	for _, rollback := range []func(bctx context.Context){
		func(bctx context.Context) { require.NoError(t, lot.Purge(bctx, "batch")) },
		func(bctx context.Context) { require.NoError(t, lot.ClearDelivered(bctx, "batch", 0, 4)) },
		func(bctx context.Context) {
			for p := range 2 {
				require.NoError(t, lot.ClearPartitionDelivered(bctx, "batch", p, 2, 0, 4))
			}
		},
	} {
		inBatch(t, false, rollback)
		require.Equal(t, []string{"ev-1", "ev-2", "ev-3", "ev-4"}, listedIDs(t, lot, "batch"), "rolled back with the batch")
	}
	p := subscriptions.PartitionOf("agg-ev-2", 2)
	inBatch(t, true, func(bctx context.Context) {
		require.NoError(t, lot.ClearDelivered(bctx, "batch", 0, 1))
		require.NoError(t, lot.ClearPartitionDelivered(bctx, "batch", p, 2, 1, 4))
	})
	var want []string
	for _, id := range []string{"ev-2", "ev-3", "ev-4"} {
		if subscriptions.PartitionOf("agg-"+id, 2) != p {
			want = append(want, id)
		}
	}
	require.Equal(t, append([]string{}, want...), listedIDs(t, lot, "batch"), "committed with the batch")
	inBatch(t, true, func(bctx context.Context) { require.NoError(t, lot.Purge(bctx, "batch")) })
	require.Empty(t, listedIDs(t, lot, "batch"))

	t.Run("a transaction of another pool is not joined, even on the same database", func(t *testing.T) {
		other := pg.OpenPgx(t)
		tx, err := other.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		bctx := pgxstore.WithBatchTx(ctx, tx, other)
		require.False(t, lot.ClearsInBatch(bctx))
		require.NoError(t, lot.Park(bctx, entry("ev-same", 9)))
		require.Contains(t, listedIDs(t, lot, "batch"), "ev-same", "committed on its own, at once")
		_, err = lot.Discard(ctx, "batch", "ev-same")
		require.NoError(t, err)
	})

	t.Run("a transaction on another database is ignored", func(t *testing.T) {
		_, foreign := newDatabase(t)
		_, err := pgxstore.NewParkingLot(ctx, foreign) // the table exists there too
		require.NoError(t, err)
		tx, err := foreign.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		fctx := pgxstore.WithBatchTx(ctx, tx, foreign)
		require.False(t, lot.ClearsInBatch(fctx))
		require.NoError(t, lot.Park(fctx, entry("ev-foreign", 10)))
		require.Equal(t, []string{"ev-foreign"}, listedIDs(t, lot, "batch"), "parked on the lot's own database, at once")
		var n int
		require.NoError(t, tx.QueryRow(ctx, "SELECT COUNT(*) FROM parked_events").Scan(&n))
		require.Zero(t, n, "nothing written to the other database")
	})
}

// TestReplayTransaction: the replay's handler writes through its
// transaction (pgxstore.TxFromContext), which commits with the clearing of
// the entry or rolls back with the entry left; a handler that commits or
// rolls the transaction back (refused), or ends it with a statement, fails
// the replay and leaves the entry; a panicking handler leaves it too.
func TestReplayTransaction(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	lot, _, pool := newLot(t)
	_, err := pool.Exec(ctx, "CREATE TABLE replay_writes (id text PRIMARY KEY)")
	require.NoError(t, err)
	writes := func() []string {
		rows, err := pool.Query(ctx, "SELECT id FROM replay_writes ORDER BY id")
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return append([]string{}, ids...)
	}
	write := func(hctx context.Context, id string) error {
		tx := pgxstore.TxFromContext(hctx)
		if tx == nil {
			return errors.New("no transaction in the handler's context")
		}
		_, err := tx.Exec(hctx, "INSERT INTO replay_writes (id) VALUES ($1)", id)
		return err
	}
	park := func(id string) {
		require.NoError(t, lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: "rtx", EventID: id, Position: 1}))
	}
	replay := func(id string, h subscriptions.Handler) error {
		return lot.Replay(ctx, "rtx", id, domain.EventEnvelope[any]{ID: id}, h)
	}

	park("ev-fail")
	errHandler := errors.New("handler failed")
	err = replay("ev-fail", func(hctx context.Context, _ domain.EventEnvelope[any]) error {
		require.NoError(t, write(hctx, "ev-fail"))
		return errHandler
	})
	require.ErrorIs(t, err, errHandler)
	require.True(t, strings.HasPrefix(err.Error(), "pgxstore: replay event "), err.Error())
	require.Empty(t, writes(), "a failed replay rolls the handler's writes back")
	require.Equal(t, []string{"ev-fail"}, listedIDs(t, lot, "rtx"))

	require.NoError(t, replay("ev-fail", func(hctx context.Context, _ domain.EventEnvelope[any]) error {
		// A savepoint of the handler's own is fine.
		sp, err := pgxstore.TxFromContext(hctx).Begin(hctx)
		require.NoError(t, err)
		_, err = sp.Exec(hctx, "INSERT INTO replay_writes (id) VALUES ('dropped')")
		require.NoError(t, err)
		require.NoError(t, sp.Rollback(hctx))
		return write(hctx, "ev-fail")
	}))
	require.Equal(t, []string{"ev-fail"}, writes(), "the writes commit with the clearing")
	require.Empty(t, listedIDs(t, lot, "rtx"))

	for name, end := range map[string]func(hctx context.Context) error{
		"Commit":   func(hctx context.Context) error { return pgxstore.TxFromContext(hctx).Commit(hctx) },
		"Rollback": func(hctx context.Context) error { return pgxstore.TxFromContext(hctx).Rollback(hctx) },
	} {
		id := "ev-" + name
		park(id)
		err := replay(id, func(hctx context.Context, _ domain.EventEnvelope[any]) error {
			require.NoError(t, write(hctx, id))
			require.ErrorIs(t, end(hctx), pgxstore.ErrTxOwnedByBatch)
			return nil // swallowed: the replay fails all the same
		})
		require.ErrorIs(t, err, pgxstore.ErrTxOwnedByBatch, name)
		require.Equal(t, []string{"ev-fail"}, writes(), "%s: the write is rolled back", name)
		require.Equal(t, []string{id}, listedIDs(t, lot, "rtx"), name)
		_, err = lot.Discard(ctx, "rtx", id)
		require.NoError(t, err)
	}

	park("ev-statement")
	err = replay("ev-statement", func(hctx context.Context, _ domain.EventEnvelope[any]) error {
		_, err := pgxstore.TxFromContext(hctx).Exec(hctx, "ROLLBACK")
		return err
	})
	require.ErrorIs(t, err, pgxstore.ErrTxOwnedByBatch)
	require.Equal(t, []string{"ev-statement"}, listedIDs(t, lot, "rtx"), "the entry stays")

	park("ev-panic")
	require.Panics(t, func() {
		_ = replay("ev-panic", func(hctx context.Context, _ domain.EventEnvelope[any]) error {
			require.NoError(t, write(hctx, "ev-panic"))
			panic("handler panic")
		})
	})
	require.Equal(t, []string{"ev-fail"}, writes(), "a panicking handler's write is rolled back")
	require.Equal(t, []string{"ev-panic", "ev-statement"}, listedIDs(t, lot, "rtx"), "by position, then event ID")
	require.NoError(t, replay("ev-panic", func(context.Context, domain.EventEnvelope[any]) error { return nil }),
		"the entry is not left locked")
}

// TestParkRefusesWhatTheGormLotRefuses: the pgx lot refuses exactly the
// entries subscriptions.GormParkingLot refuses, with the same message
// under its own prefix.
func TestParkRefusesWhatTheGormLotRefuses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newSharedLots(t)
	long := strings.Repeat("x", subscriptions.MaxSubscriberNameBytes)
	for name, p := range map[string]subscriptions.ParkedEvent{
		"valid":                     {Subscriber: "v", EventID: "e"},
		"at the bounds":             {Subscriber: long, EventID: long},
		"empty subscriber":          {EventID: "e"},
		"empty event ID":            {Subscriber: "v"},
		"subscriber too long":       {Subscriber: long + "x", EventID: "e"},
		"event ID too long":         {Subscriber: "v", EventID: long + "x"},
		"NUL in subscriber":         {Subscriber: "v\x00", EventID: "e"},
		"NUL in event ID":           {Subscriber: "v", EventID: "e\x00"},
		"invalid UTF-8 subscriber":  {Subscriber: "v\xff", EventID: "e"},
		"invalid UTF-8 event ID":    {Subscriber: "v", EventID: "e\xc3("},
		"negative attempts, stored": {Subscriber: "v", EventID: "n", Attempts: -1},
	} {
		gErr := s.gorm.Park(ctx, p)
		pErr := s.pgx.Park(ctx, p)
		if gErr == nil {
			require.NoError(t, pErr, name)
			continue
		}
		require.Error(t, pErr, name)
		require.True(t, strings.HasPrefix(pErr.Error(), "pgxstore: "), "%s: %v", name, pErr)
		require.Equal(t, strings.TrimPrefix(gErr.Error(), "subscriptions: "), strings.TrimPrefix(pErr.Error(), "pgxstore: "), name)
	}
}
