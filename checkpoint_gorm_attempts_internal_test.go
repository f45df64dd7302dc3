package subscriptions

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestAttemptClaims: the attempt record a Postgres batch commits before it
// takes the checkpoint row again is a claim that another replica taking
// the row in that moment respects (it gives the batch up as if the row
// were locked), while the claim is live; a claim whose server process is
// gone, one that is too old, and one its batch released by rolling back
// keep nobody out, and a failure recorded by another runner never
// overwrites a live claim. On SQLite, one process, claims keep nobody out.
func TestAttemptClaims(t *testing.T) {
	t.Parallel()
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			db := b.Open(t)
			g, err := NewGormCheckpointStore(db)
			require.NoError(t, err)
			ctx := context.Background()
			const name = "claims"
			require.NoError(t, g.Reset(ctx, name, 7))
			rec := AttemptRecord{Position: 7, EventID: "e8", Through: 9, Attempts: 1, Holder: "runner-b"}

			// claim writes the record of runner-a's attempt from 7 as its
			// batch commits it, by the server process of conn (or with the
			// server's pid of a process that has gone, when dead).
			claim := func(t *testing.T, pid string, age string) {
				t.Helper()
				claimedAt := "statement_timestamp() - interval '" + age + "'"
				require.NoError(t, db.Exec("DELETE FROM subscriber_attempts").Error)
				if !b.Postgres { // no claims: another runner's record of an attempt
					require.NoError(t, db.Exec(`INSERT INTO subscriber_attempts (subscriber, position, event_id, through, attempts, last_error)
						VALUES (?, 7, 'e8', 9, 1, '')`, name).Error)
					return
				}
				require.NoError(t, db.Exec(`INSERT INTO subscriber_attempts (subscriber, position, event_id, through, attempts, last_error, holder, holder_pid, claimed_at)
					VALUES (?, 7, 'e8', 9, 1, '', 'runner-a', `+pid+`, `+claimedAt+`)`, name).Error)
			}
			acquire := func(t *testing.T) Batch {
				t.Helper()
				batch, ok, err := g.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, ok)
				return batch
			}
			alivePID := "0"
			if b.Postgres {
				// A server process that stays: a connection held by the test.
				pool, err := db.DB()
				require.NoError(t, err)
				conn, err := pool.Conn(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = conn.Close() })
				var pid int64
				require.NoError(t, conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
				alivePID = strconv.FormatInt(pid, 10)
			}

			t.Run("live claim", func(t *testing.T) {
				claim(t, alivePID, "0 seconds")
				batch := acquire(t)
				_, _, err := g.BeginAttempt(ctx, batch, name, rec)
				if !b.Postgres {
					require.NoError(t, err, "SQLite: one process, nobody to keep out")
					require.NoError(t, batch.Rollback())
					return
				}
				require.ErrorIs(t, err, ErrAttemptClaimed)
				require.NoError(t, batch.Rollback())
				batch = acquire(t)
				require.ErrorIs(t, g.PutAttempt(ctx, batch, name, AttemptRecord{Position: 9, EventID: "e10", Through: 10, Attempts: 1}), ErrAttemptClaimed)
				require.NoError(t, batch.Rollback())
				batch = acquire(t)
				require.NoError(t, g.FailAttempt(ctx, batch, name, AttemptRecord{Position: 7, EventID: "e8", Through: 8, LastError: "boom", Holder: "runner-b"}))
				require.Equal(t, "runner-a", claimHolder(t, db, name), "a failure of another runner leaves a live claim alone")
			})
			if !b.Postgres {
				return
			}
			for _, tc := range []struct{ what, pid, age string }{
				{"claim of a server process that has gone", "2147483646", "0 seconds"},
				{"claim past the lease", alivePID, "1 hour"},
			} {
				t.Run(tc.what, func(t *testing.T) {
					claim(t, tc.pid, tc.age)
					batch := acquire(t)
					prev, found, err := g.BeginAttempt(ctx, batch, name, rec)
					require.NoError(t, err)
					require.True(t, found, "an attempt that did not complete: counted on")
					require.Equal(t, 1, prev.Attempts)
					require.NoError(t, batch.Rollback())
				})
			}
			t.Run("a claimed record ahead of the checkpoint", func(t *testing.T) {
				// runner-a committed the record of the commit its batch is
				// about to make (to 9), and takes the row again: a batch
				// of runner-b that took the row at 7 meanwhile must not
				// replace it.
				require.NoError(t, db.Exec("DELETE FROM subscriber_attempts").Error)
				require.NoError(t, db.Exec(`INSERT INTO subscriber_attempts (subscriber, position, event_id, through, attempts, last_error, holder, holder_pid, claimed_at)
					VALUES (?, 9, 'e10', 10, 1, 'boom', 'runner-a', `+alivePID+`, statement_timestamp())`, name).Error)
				batch := acquire(t)
				_, _, err := g.BeginAttempt(ctx, batch, name, rec)
				require.ErrorIs(t, err, ErrAttemptClaimed)
				require.NoError(t, batch.Rollback())
				var position int64
				require.NoError(t, db.Raw("SELECT position FROM subscriber_attempts WHERE subscriber = ?", name).Scan(&position).Error)
				require.EqualValues(t, 9, position, "the record of the commit to come stands")
			})
			t.Run("a commit releases its claim", func(t *testing.T) {
				require.NoError(t, db.Exec("DELETE FROM subscriber_attempts").Error)
				batch := acquire(t)
				require.NoError(t, g.PutAttempt(ctx, batch, name, AttemptRecord{Position: 9, EventID: "e10", Through: 10, Attempts: 1, LastError: "boom", Holder: "runner-a"}))
				require.Equal(t, "runner-a", claimHolder(t, db, name))
				require.NoError(t, batch.Commit(ctx, 9))
				require.Empty(t, claimHolder(t, db, name), "released with the commit")
				require.NoError(t, g.Reset(ctx, name, 7))
			})
			t.Run("a rolled-back batch releases its claim", func(t *testing.T) {
				require.NoError(t, db.Exec("DELETE FROM subscriber_attempts").Error)
				batch := acquire(t)
				_, found, err := g.BeginAttempt(ctx, batch, name, AttemptRecord{Position: 7, EventID: "e8", Through: 9, Attempts: 1, Holder: "runner-a"})
				require.NoError(t, err)
				require.False(t, found)
				require.Equal(t, "runner-a", claimHolder(t, db, name), "committed before the handlers run")
				require.NoError(t, batch.Rollback())
				require.Empty(t, claimHolder(t, db, name))
				batch = acquire(t)
				_, found, err = g.BeginAttempt(ctx, batch, name, rec)
				require.NoError(t, err)
				require.True(t, found)
				require.NoError(t, batch.Rollback())
			})
		})
	}
}

func claimHolder(t *testing.T, db *gorm.DB, name string) string {
	t.Helper()
	var holder string
	require.NoError(t, db.Raw("SELECT holder FROM subscriber_attempts WHERE subscriber = ?", name).Scan(&holder).Error)
	return holder
}
