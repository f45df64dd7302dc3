package subscriptions

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dialect"
	"github.com/eventfeed/subscriptions/internal/pgxconn"
)

// cancelRetryInterval is how often cancelBackendOnDone repeats its cancel
// request while the statements it guards have not returned: a request that
// reaches the backend between two statements is ignored by Postgres.
const cancelRetryInterval = 20 * time.Millisecond

// cancelRequestTimeout bounds one out-of-band cancel request, which stop
// waits for rather than abandon (see cancelBackendOnDone).
const cancelRequestTimeout = 10 * time.Second

// cancelBackendOnDone cancels, on the database server, the statement that
// backend pid is running once ctx ends (d.CancelBackend), and keeps doing
// so until stop is called. It exists because a client-side cancellation (the driver closing
// its socket when ctx ends) leaves the server still running the statement:
// a backend waiting for a row lock notices the closed socket only after it
// got the lock, so the lock would outlive the call that was abandoned.
//
// conn is the caller's dedicated connection (gorm's Connection) whose
// server process is pid; the caller must own it until stop returns; stop
// ends the goroutine and waits for it, so that no cancel request is sent
// once the connection goes back to the pool. On a pgx pool the requests
// are Postgres' out-of-band cancel requests for conn (pgconn.CancelRequest:
// a short network connection of their own, not a session, so the pool's
// budget holds: nothing waits for a second pool connection while it holds
// one); on another driver they are d.CancelBackend statements through db,
// on another connection of the pool. Either goes without ctx (it has
// ended); a request that fails is retried at the next tick, and stop ends
// the retries and any statement still waiting for a connection (an
// out-of-band request under way is let finish).
//
// stop reports whether a cancel request was sent. If so, the caller must
// discard the connection of pid rather than return it to the pool
// (discardConn): a request that stop abandoned may still reach the server,
// and a request's signal may be handled after the guarded statement has
// ended, so either could cancel whatever statement the connection's next
// user runs (seen as a 57014 on an unrelated Position call).
func cancelBackendOnDone(ctx context.Context, conn, db *gorm.DB, d *dialect.Dialect, pid int64) (stop func() (sent bool)) {
	request := func(ctx context.Context) { _ = db.WithContext(ctx).Exec(d.CancelBackend(), pid).Error }
	if c, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
		_ = c.Raw(func(dc any) error {
			if pc, ok := pgxconn.Unwrap(dc); ok {
				pg := pc.PgConn() // CancelRequest is safe while the connection is in use
				request = func(context.Context) {
					// Not ended by stop but bounded: a request abandoned
					// halfway closes its connection before the server, or
					// a pooler, has answered it, and PgBouncer 1.18 exits
					// on that ("bad client state"), closing every client.
					cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelRequestTimeout)
					defer cancel()
					_ = pg.CancelRequest(cctx)
				}
			}
			return nil
		})
	}
	stopped := make(chan struct{})
	done := make(chan struct{})
	var requested bool // written by the goroutine, read by stop after done
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
			requested = true
			// The error is not actionable here: the guarded statement
			// returns on its own once the row is free, and the next tick
			// tries again.
			request(reqCtx)
			select {
			case <-ticker.C:
			case <-stopped:
				return
			}
		}
	}()
	return func() bool {
		close(stopped)
		endRequests()
		<-done
		return requested
	}
}

// discardConn closes the dedicated connection conn runs on (a *gorm.DB of
// gorm's Connection) instead of letting it go back to the pool: a
// driver.ErrBadConn from Raw makes database/sql close the driver
// connection. It is for a connection that may still receive a cancel
// request meant for a statement it has finished (cancelBackendOnDone).
func discardConn(conn *gorm.DB) {
	if c, ok := conn.Statement.ConnPool.(*sql.Conn); ok {
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
}
