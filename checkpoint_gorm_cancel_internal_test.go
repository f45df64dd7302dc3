package subscriptions

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/dialect"
)

// TestCancelBackendDiscardsACancelledConnection: once a cancel request was
// sent for a backend, its connection never goes back to the pool, so a
// late request (abandoned by stop, or a signal handled after the guarded
// statement ended) cannot cancel the next user's statement; a guarded
// connection whose context never ended is reused as usual.
func TestCancelBackendDiscardsACancelledConnection(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	d := dialect.Of(pg.DB)
	sqlDB, err := pg.DB.DB()
	require.NoError(t, err)
	sqlDB.SetMaxIdleConns(4)

	// guarded runs `SELECT pg_sleep(sleep)` on a dedicated connection under
	// cancelBackendOnDone(ctx) and returns the backend's pid, whether a
	// cancel was sent, and the statement's error.
	guarded := func(ctx context.Context, sleep float64) (pid int64, sent bool, stmtErr error) {
		err := pg.DB.WithContext(context.Background()).Connection(func(conn *gorm.DB) error {
			if err := conn.Raw(d.BackendPID()).Scan(&pid).Error; err != nil {
				return err
			}
			stop := cancelBackendOnDone(ctx, conn, pg.DB, d, pid)
			stmtErr = conn.Exec("SELECT pg_sleep(?)", sleep).Error
			if sent = stop(); sent {
				discardConn(conn)
			}
			return nil
		})
		require.NoError(t, err)
		return pid, sent, stmtErr
	}
	alive := func(pid int64) bool {
		var n int
		require.NoError(t, pg.DB.Raw("SELECT count(*) FROM pg_stat_activity WHERE pid = ?", pid).Scan(&n).Error)
		return n == 1
	}

	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		pid, sent, stmtErr := guarded(ctx, 30)
		require.True(t, sent, "the context ended during the statement: a cancel request must have been sent")
		require.Error(t, stmtErr, "the server must have cancelled the sleep")
		require.Eventually(t, func() bool { return !alive(pid) }, 30*time.Second, 20*time.Millisecond,
			"the connection of backend %d was cancelled and must be closed, not pooled", pid)
	})

	t.Run("not cancelled", func(t *testing.T) {
		pid, sent, stmtErr := guarded(context.Background(), 0)
		require.NoError(t, stmtErr)
		require.False(t, sent)
		require.True(t, alive(pid), "an untouched connection goes back to the pool")
	})
}
