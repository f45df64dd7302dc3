package infrastructure_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// TestAppendInsideACallersTransaction builds a store on a caller's
// transaction (a unit of work): the append and the application's own
// write commit or roll back together, on every database, and nothing is
// committed outside the transaction.
func TestAppendInsideACallersTransaction(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, commit := range []bool{true, false} {
				name := map[bool]string{true: "commit", false: "rollback"}[commit]
				t.Run(name, func(t *testing.T) {
					ctx := testCtx(t)
					db := b.Open(t)
					outside := newGormStore(t, db)
					require.NoError(t, db.Exec("CREATE TABLE accounts (id text PRIMARY KEY)").Error)

					tx := db.Begin()
					require.NoError(t, tx.Error)
					defer tx.Rollback()
					store := newGormStore(t, tx)
					require.NoError(t, tx.Exec("INSERT INTO accounts (id) VALUES ('acc-1')").Error)
					opened := newEvent("acc-1", "account.opened", map[string]any{"owner": "ann"})
					require.NoError(t, store.Append(ctx, "acc-1", 0, opened))

					inside, err := store.GetEvents(ctx, "acc-1")
					require.NoError(t, err)
					require.Equal(t, []string{opened.ID}, ids(inside), "the transaction reads its own append")

					var later chan error
					if b.Postgres {
						// Another connection sees nothing yet, and an append
						// through it waits for the transaction's append lock.
						_, err := outside.GetEventByID(ctx, opened.ID)
						require.ErrorIs(t, err, domain.ErrEventNotFound)
						feed, err := outside.ReadAfter(ctx, 0, 0)
						require.NoError(t, err)
						require.Empty(t, feed)
						later = feedtest.Async(func() error {
							return outside.Append(context.Background(), "acc-2", 0, newEvent("acc-2", "account.opened", nil))
						})
						eventually(t, "an append outside the transaction waits for the append lock", func() bool {
							var qualified string
							require.NoError(t, db.Raw(`SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
								FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
								WHERE c.oid = to_regclass('events')`).Scan(&qualified).Error)
							key := schema.LockKey("append", qualified)
							var waiting int
							require.NoError(t, db.Raw(`SELECT COUNT(*) FROM pg_locks
								WHERE locktype = 'advisory' AND NOT granted
								AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
								AND classid::bigint = ? AND objid::bigint = ? AND objsubid = 1`,
								int64(uint32(uint64(key)>>32)), int64(uint32(key))).Scan(&waiting).Error)
							return waiting == 1
						})
					}

					if commit {
						require.NoError(t, tx.Commit().Error)
					} else {
						require.NoError(t, tx.Rollback().Error)
					}
					if later != nil {
						require.NoError(t, feedtest.Result(t, later, "the append outside the transaction"))
					}
					var accounts int64
					require.NoError(t, db.Raw("SELECT COUNT(*) FROM accounts").Scan(&accounts).Error)
					got, err := outside.GetEventByID(ctx, opened.ID)
					if !commit {
						require.Zero(t, accounts)
						require.ErrorIs(t, err, domain.ErrEventNotFound, "a rolled-back unit of work leaves no event")
						return
					}
					require.Equal(t, int64(1), accounts)
					require.NoError(t, err)
					require.Equal(t, int64(1), got.Position, "committed first, so first in the feed")
					feed, err := outside.ReadAfter(ctx, 0, 0)
					require.NoError(t, err)
					requireStrictlyIncreasing(t, feed)
					require.Equal(t, opened.ID, feed[0].ID)
				})
			}
		})
	}
}

// TestPostgresAppendRefusesASnapshotTransaction: under REPEATABLE READ
// the transaction's snapshot may predate appends committed before it took
// the append lock, so the append is refused with the fix in the message.
func TestPostgresAppendRefusesASnapshotTransaction(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	newGormStore(t, pg.DB)
	err := pg.DB.Transaction(func(tx *gorm.DB) error {
		store := newGormStore(t, tx)
		return store.Append(ctx, "snap", 0, newEvent("snap", "x", nil))
	}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.Error(t, err)
	require.ErrorContains(t, err, "READ COMMITTED")
	require.False(t, errors.Is(err, domain.ErrConcurrencyConflict))
	version, err := newGormStore(t, pg.DB).GetCurrentVersion(ctx, "snap")
	require.NoError(t, err)
	require.Zero(t, version)
}
