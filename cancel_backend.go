package subscriptions

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dialect"
)

// cancelRetryInterval is how often cancelBackendOnDone repeats its cancel
// request while the statements it guards have not returned: a request that
// reaches the backend between two statements is ignored by Postgres.
const cancelRetryInterval = 20 * time.Millisecond

// cancelBackendOnDone cancels, on the database server, the statement that
// backend pid is running once ctx ends (d.CancelBackend), and keeps doing
// so until stop is called. It exists because a client-side cancellation (the driver closing
// its socket when ctx ends) leaves the server still running the statement:
// a backend waiting for a row lock notices the closed socket only after it
// got the lock, so the lock would outlive the call that was abandoned.
//
// The caller must own the connection of pid (a dedicated *sql.Conn) until
// stop returns; stop ends the goroutine and waits for it, so that no cancel
// request is sent once the connection goes back to the pool. The requests
// go through db, on another connection, without ctx (it has ended); a
// request that fails is retried at the next tick, and stop ends the
// retries and any request still waiting.
func cancelBackendOnDone(ctx context.Context, db *gorm.DB, d *dialect.Dialect, pid int64) (stop func()) {
	stopped := make(chan struct{})
	done := make(chan struct{})
	// Ended by stop, so that a request waiting for a pool connection
	// cannot hold stop up.
	reqCtx, endRequests := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
		case <-stopped:
			return
		}
		ticker := time.NewTicker(cancelRetryInterval)
		defer ticker.Stop()
		for {
			// The error is not actionable here: the guarded statement
			// returns on its own once the row is free, and the next tick
			// tries again.
			_ = db.WithContext(reqCtx).Exec(d.CancelBackend(), pid).Error
			select {
			case <-ticker.C:
			case <-stopped:
				return
			}
		}
	}()
	return func() {
		close(stopped)
		endRequests()
		<-done
	}
}
