package subscriptions

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/eventrow"
	"github.com/eventfeed/subscriptions/internal/pgxconn"
)

// errNoPipeline is acquireAndRead's "take the ordinary path" answer.
var errNoPipeline = errors.New("pipelined acquire not available")

var _ FeedAcquirer = (*GormCheckpointStore)(nil)

// SharesFeed reports whether events is a GormEventStore on this store's
// own pool and schema (WithSchema): its batches then read that feed in
// their transaction (BatchFeedReader), and on Postgres with pgx
// AcquireAfter reads it in the acquisition's round trip. Tenants sharing
// one pool share no feed: each batch reads the events table of its
// store's schema.
func (g *GormCheckpointStore) SharesFeed(events domain.EventStore) bool {
	db, ok := eventrow.StoreDB(events)
	if !ok || eventrow.StoreSchema(events) != g.schema {
		return false
	}
	pool, err := db.DB()
	return err == nil && pool == g.pool
}

// AcquireAfter begins the batch, locks the checkpoint and reads the shared
// feed in one round trip on Postgres with pgx (acquireAndRead); elsewhere,
// and when the row is not locked here (held, paused or missing), it
// declines (ok false) and the ordinary path decides.
func (g *GormCheckpointStore) AcquireAfter(ctx context.Context, subscriber string, after int64, limit int) (Batch, []domain.EventEnvelope[any], bool, error) {
	if !g.dialect.Pipelines {
		return nil, nil, false, nil
	}
	batch, events, err := g.acquireAndRead(ctx, subscriber, after, limit)
	if errors.Is(err, errNoPipeline) {
		return nil, nil, false, nil
	}
	return batch, events, err == nil, err
}

// acquireAndRead sends BEGIN, the checkpoint lock, the read of the
// attempt record and the feed read as one pgx batch on a connection
// pinned for the batch's lifetime: one round trip where the ordinary path
// needs four, which is most of the latency between a NOTIFY and the
// handler. The statements are the ordinary path's; the feed read merely
// runs inside the batch's transaction (READ COMMITTED, so it sees what a
// separate read would), and the attempt record is read there as the
// batch's first HasAttempt would read it (prefetchedAttempt). The caller
// checks the batch's position against after, exactly as on the ordinary
// path.
func (g *GormCheckpointStore) acquireAndRead(ctx context.Context, subscriber string, after int64, limit int) (Batch, []domain.EventEnvelope[any], error) {
	conn, err := g.pool.Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("subscriptions: acquire checkpoint of %q: %w", subscriber, err)
	}
	var (
		locked      *pipelined
		undecodable *eventrow.DecodeError
	)
	err = conn.Raw(func(dc any) error {
		pc, ok := pgxconn.Unwrap(dc)
		if !ok {
			return errNoPipeline
		}
		locked, err = sendAcquireBatch(ctx, pc, g.sql, subscriber, after, limit)
		if err != nil || locked == nil {
			return pgxconn.EndSession(ctx, pc, err)
		}
		return nil
	})
	if errors.As(err, &undecodable) {
		// Rolled back (EndSession): a stored event does not decode, which
		// is a failed read of the feed, not of the checkpoint.
		_ = conn.Close()
		return nil, nil, fmt.Errorf("subscriptions: read feed after position %d: %w", after, undecodable)
	}
	if err != nil || locked == nil {
		_ = conn.Close()
		if err == nil {
			// Not locked: held by another replica, or not created yet. The
			// ordinary path tells the two apart and creates the row.
			err = errNoPipeline
		}
		if !errors.Is(err, errNoPipeline) {
			err = fmt.Errorf("subscriptions: acquire checkpoint of %q: %w", subscriber, err)
		}
		return nil, nil, err
	}
	tx := g.db.WithContext(ctx).Session(&gorm.Session{NewDB: true})
	tx.Statement.ConnPool = &pinnedTx{conn: conn}
	b := &gormBatch{store: g, subscriber: subscriber, tx: tx, conn: conn, position: *locked.row.Position, marks: locked.row.marks(),
		attempt: locked.attempt, done: make(chan struct{})}
	return b, locked.events, nil
}

// pipelined is what sendAcquireBatch read once it locked the row.
type pipelined struct {
	row     lockedRow
	attempt prefetchedAttempt
	events  []domain.EventEnvelope[any]
}

// sendAcquireBatch returns what it read with the row it locked, nil when
// it locked none, with the statements q: the lock (lockRowPgx), then the
// position of the subscriber's attempt record, for the batch's first
// HasAttempt (pipelinedAttempt, see prefetchedAttempt), then the ordinary
// feed read (GormEventStore.ReadAfter) with pgx's placeholders
// (pipelinedFeed). A stored event that does not decode fails it with an
// *eventrow.DecodeError.
func sendAcquireBatch(ctx context.Context, pc *pgx.Conn, q *checkpointSQL, subscriber string, after int64, limit int) (*pipelined, error) {
	batch := &pgx.Batch{}
	batch.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	batch.Queue(q.lockRowPgx, subscriber, PauseKey(subscriber))
	batch.Queue(q.pipelinedAttempt, subscriber)
	batch.Queue(q.pipelinedFeed, after, limit)
	br := pc.SendBatch(ctx, batch)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	var p pipelined
	row := &p.row
	if err := br.QueryRow().Scan(&row.Position, &row.Redelivered, &row.Present, &row.Paused, &row.CatchUp); err != nil {
		return nil, fmt.Errorf("lock row: %w", err)
	}
	if row.Position == nil || row.Paused {
		return nil, br.Close()
	}
	var at int64
	switch err := br.QueryRow().Scan(&at); {
	case err == nil:
		p.attempt = prefetchedAttempt{known: true, exists: true, position: at}
	case errors.Is(err, pgx.ErrNoRows):
		p.attempt = prefetchedAttempt{known: true}
	default:
		return nil, fmt.Errorf("read the attempt record: %w", err)
	}
	rows, _ := br.Query() // its error is the rows' too
	var err error
	if p.events, err = eventrow.ReadEnvelopes(rows, limit); err != nil {
		if errors.As(err, new(*eventrow.DecodeError)) {
			return nil, err
		}
		return nil, fmt.Errorf("read feed after position %d: %w", after, err)
	}
	return &p, br.Close()
}

// pinnedTx is the GORM connection pool of a pipelined batch: a connection
// pinned from the pool whose session holds the transaction the pipeline
// began. It implements gorm.TxCommitter, so the batch commits, rolls back
// and takes savepoints exactly like a database/sql transaction; the
// connection stays pinned after Commit and Rollback, for the batch to
// begin again on it (renew) or return it to the pool (closeConn). It
// belongs to the batch's goroutine.
type pinnedTx struct {
	conn *sql.Conn
	// ended is set by Commit or Rollback. The closed conn stays: its
	// methods then fail with sql.ErrConnDone instead of dereferencing nil.
	ended bool
}

var (
	_ gorm.ConnPool    = (*pinnedTx)(nil)
	_ gorm.TxCommitter = (*pinnedTx)(nil)
)

func (p *pinnedTx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return p.conn.PrepareContext(ctx, query)
}

func (p *pinnedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return p.conn.ExecContext(ctx, query, args...)
}

func (p *pinnedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return p.conn.QueryContext(ctx, query, args...)
}

func (p *pinnedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return p.conn.QueryRowContext(ctx, query, args...)
}

// exec runs one statement (pgx's placeholders) in the transaction, on the
// pinned connection's pgx session, past GORM and database/sql: Commit's
// checkpoint UPDATE, which every batch of a catch-up pays (cmd/subbench
// -only feedread). It returns the rows affected.
func (p *pinnedTx) exec(ctx context.Context, query string, args ...any) (int64, error) {
	if p.ended {
		return 0, sql.ErrTxDone
	}
	var affected int64
	err := p.conn.Raw(func(dc any) error {
		pc, _ := pgxconn.Unwrap(dc) // pinned only after Unwrap succeeded
		tag, err := pc.Exec(ctx, query, args...)
		affected = tag.RowsAffected()
		return err
	})
	return affected, err
}

func (p *pinnedTx) Commit() error   { return p.end("COMMIT") }
func (p *pinnedTx) Rollback() error { return p.end("ROLLBACK") }

// end runs COMMIT or ROLLBACK. A COMMIT that Postgres turned into a
// rollback (the transaction had failed) is an error, as database/sql
// reports it; a connection whose state is unknown after a failure is
// marked bad, so that database/sql discards it when it is closed.
func (p *pinnedTx) end(stmt string) error {
	if p.ended {
		return sql.ErrTxDone
	}
	p.ended = true
	conn := p.conn
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var endErr error
	err := conn.Raw(func(dc any) error {
		pc, _ := pgxconn.Unwrap(dc) // pinned only after Unwrap succeeded
		tag, err := pc.Exec(ctx, stmt)
		if err == nil && stmt == "COMMIT" && tag.String() != "COMMIT" {
			endErr = fmt.Errorf("commit: %w (%s)", errTxRolledBack, tag.String())
		}
		if err != nil {
			endErr = err
			_ = pc.Close(ctx) // state unknown: never reuse the connection
			return driver.ErrBadConn
		}
		return nil
	})
	if endErr == nil {
		return err
	}
	return endErr
}
