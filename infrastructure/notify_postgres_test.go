package infrastructure_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
)

// notifyListener is a LISTEN connection that only counts notifications
// sent by one backend: the channel is database-wide, and other tests (in
// this or other packages) append in their own schemas concurrently.
type notifyListener struct {
	conn *pgx.Conn
	pid  uint32 // the store's only connection
}

// quietPeriod bounds the negative checks: a notification that was sent
// arrives within milliseconds, so a short wait is enough to say "none".
const quietPeriod = 300 * time.Millisecond

// next waits up to wait for a notification from the store's backend and
// reports whether one came.
func (l *notifyListener) next(t testing.TB, wait time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return false
		}
		require.NoError(t, err)
		require.Equal(t, infrastructure.PostgresNotifyChannel, n.Channel)
		if n.PID == l.pid {
			require.Empty(t, n.Payload)
			return true
		}
	}
}

func TestPostgresNotifyOnCommittedAppendsOnly(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	db := pg.Open(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1) // one backend, so notifications can be told apart
	store := newGormStore(t, db)
	var pid uint32
	require.NoError(t, db.Raw("SELECT pg_backend_pid()").Scan(&pid).Error)

	l := &notifyListener{conn: pgfeed.Connect(t, pg.DSN), pid: pid}
	_, err = l.conn.Exec(ctx, "LISTEN "+pgx.Identifier{infrastructure.PostgresNotifyChannel}.Sanitize())
	require.NoError(t, err)

	steps := []struct {
		name   string
		append func() error
		notify bool
	}{
		{"committed append", func() error { return store.Append(ctx, "a", 0, newEvent("a", "x", nil)) }, true},
		{"concurrency conflict", func() error { return store.Append(ctx, "a", 0, newEvent("a", "x", nil)) }, false},
		{"invalid event", func() error { return store.Append(ctx, "a", 1, newEvent("a", "", nil)) }, false},
		{"duplicate event ID (fails inside the transaction)", func() error {
			dup := newEvent("b", "x", nil)
			if err := store.Append(ctx, "b", 0, dup); err != nil {
				return err
			}
			require.True(t, l.next(t, 10*time.Second), "the first append of b notifies")
			return store.Append(ctx, "b", 1, dup)
		}, false},
		{"append without events, version mismatch", func() error { return store.Append(ctx, "a", 7) }, false},
		{"committed multi-event append", func() error {
			return store.Append(ctx, "a", 1, newEvent("a", "x", nil), newEvent("a", "y", nil))
		}, true},
	}
	for _, step := range steps {
		err := step.append()
		if step.name == "append without events, version mismatch" {
			// An append of nothing that succeeds stores nothing either: it
			// must not wake subscribers.
			require.NoError(t, store.Append(ctx, "a", 1))
		}
		if step.notify {
			require.NoError(t, err, step.name)
			require.True(t, l.next(t, 10*time.Second), "%s: a notification arrives", step.name)
			require.False(t, l.next(t, quietPeriod), "%s: exactly one notification per append", step.name)
		} else {
			require.Error(t, err, step.name)
			require.True(t, errors.Is(err, domain.ErrConcurrencyConflict) || errors.Is(err, domain.ErrInvalidEvent), "%s: %v", step.name, err)
			require.False(t, l.next(t, quietPeriod), "%s: a failed append notifies nobody", step.name)
		}
	}
}

// TestPostgresNotifyIsDeliveredAtCommit holds an append open after its
// insert: no notification may arrive before it commits.
func TestPostgresNotifyIsDeliveredAtCommit(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	db := pg.Open(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)
	store := newGormStore(t, db)
	var pid uint32
	require.NoError(t, db.Raw("SELECT pg_backend_pid()").Scan(&pid).Error)
	gate := pgfeed.NewGate(t, pg)

	l := &notifyListener{conn: pgfeed.Connect(t, pg.DSN), pid: pid}
	_, err = l.conn.Exec(ctx, "LISTEN "+pgx.Identifier{infrastructure.PostgresNotifyChannel}.Sanitize())
	require.NoError(t, err)

	done := feedtest.Async(func() error { return store.Append(context.Background(), "held", 0, newEvent("held", "x", nil)) })
	gate.WaitHeld(t, 1)
	require.False(t, l.next(t, quietPeriod), "no notification before the append commits")
	gate.Release()
	require.NoError(t, feedtest.Result(t, done, "held append"))
	require.True(t, l.next(t, 10*time.Second), "the notification arrives at commit")
}
