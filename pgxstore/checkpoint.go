package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions"
)

// CheckpointStore is a subscriptions.CheckpointStore on pgx. Each batch is
// one transaction on one connection of the pool, holding the subscriber's
// checkpoint row locked FOR UPDATE SKIP LOCKED, so replicas of one
// subscriber, in any process and with this backend or the GORM one, take
// turns: one runs each cycle, the others skip. Handlers get the
// transaction from TxFromContext; their writes commit with the checkpoint
// advance (exactly-once).
//
// Every Commit is a compare-and-set on the position the batch started
// from, which also refuses while the name is paused: a checkpoint moved by
// a Reset, or paused, under a batch makes its Commit fail with
// subscriptions.ErrCheckpointMoved instead of overwriting the change.
//
// CheckpointStore is safe for concurrent use. It does not own the pool.
type CheckpointStore struct {
	pool   *pgxpool.Pool
	schema string        // WithSchema's; "" for the pool's search_path
	stmt   checkpointSQL // the statements, tables named in schema
	// eventsTable is the events table of the store's schema as
	// EventStore names it (pgevents.Table.Qualified), for
	// SharesFeed.
	eventsTable string
}

var (
	_ subscriptions.CheckpointStore    = (*CheckpointStore)(nil)
	_ subscriptions.CheckpointResetter = (*CheckpointStore)(nil)
	_ subscriptions.Pauser             = (*CheckpointStore)(nil)
	_ subscriptions.DeliveryMarker     = (*CheckpointStore)(nil)
)

// NewCheckpointStore applies the module's schema migrations the database
// lacks (schema.Migrate; with WithSchemaVerifyOnly it only checks them)
// and returns a store on pool, on the tables of the WithSchema schema if
// given, else of the pool's search_path.
func NewCheckpointStore(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*CheckpointStore, error) {
	cfg := newConfig(opts)
	if err := ensureSchema(ctx, "NewCheckpointStore", pool, cfg); err != nil {
		return nil, err
	}
	s := &CheckpointStore{pool: pool, schema: cfg.schema}
	s.stmt = newCheckpointSQL(s.schema)
	var err error
	if s.eventsTable, err = resolveEventsTable(ctx, pool, s.schema); err != nil {
		return nil, fmt.Errorf("pgxstore: NewCheckpointStore: %w", err)
	}
	return s, nil
}

// cancelRetryInterval is how often onServer repeats its cancel request
// until the statement it cancels is over.
const cancelRetryInterval = 20 * time.Millisecond

// txOptions pins batches to READ COMMITTED whatever the server's default:
// SKIP LOCKED and the compare-and-set are designed for it, and a stricter
// level would turn replica contention into serialization failures.
var txOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// Acquire begins a batch transaction holding the subscriber's checkpoint
// row; acquired is false when another transaction holds it or the name is
// paused. The caller owns the batch and must end it.
func (s *CheckpointStore) Acquire(ctx context.Context, subscriber string) (subscriptions.Batch, bool, error) {
	if err := subscriptions.CheckSubscriberName(subscriber); err != nil {
		return nil, false, fmt.Errorf("pgxstore: acquire: %w", err)
	}
	b, exists, err := s.lock(ctx, subscriber)
	if err != nil || b != nil || exists {
		return batchOrNil(b), b != nil, err
	}
	if _, err := s.pool.Exec(ctx, s.stmt.createRow, subscriber, time.Now().UTC()); err != nil {
		return nil, false, fmt.Errorf("pgxstore: acquire checkpoint of %q: create row: %w", subscriber, err)
	}
	b, _, err = s.lock(ctx, subscriber)
	return batchOrNil(b), b != nil, err
}

// batchOrNil keeps a nil *batch from becoming a non-nil interface.
func batchOrNil(b *batch) subscriptions.Batch {
	if b == nil {
		return nil
	}
	return b
}

// lock begins the batch transaction on a connection of its own and locks
// the row. exists reports, when it could not, whether the row exists.
func (s *CheckpointStore) lock(ctx context.Context, subscriber string) (b *batch, exists bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("pgxstore: acquire checkpoint of %q: connection: %w", subscriber, err)
	}
	var row lockedRow
	tx, err := beginWith(ctx, conn, func(pipe *pgx.Batch) {
		pipe.Queue(s.stmt.lockRow, subscriber, subscriptions.PauseKey(subscriber)).QueryRow(func(r pgx.Row) error {
			return r.Scan(row.targets()...)
		})
	})
	if err != nil {
		return nil, false, fmt.Errorf("pgxstore: acquire checkpoint of %q: lock row: %w", subscriber, err)
	}
	if row.position == nil || row.paused {
		endTx(tx, conn)
		return nil, row.present, nil // held elsewhere, paused, or missing
	}
	return row.batch(s, subscriber, conn, tx), true, nil
}

// beginWith begins a batch transaction on conn and runs the statements
// queue adds in the same pipeline, in one round trip: pgx's
// Batch.BeginTx sends the BEGIN at its head instead of awaiting it on its
// own. If it fails, the connection has been handed back.
func beginWith(ctx context.Context, conn *pgxpool.Conn, queue func(pipe *pgx.Batch)) (pgx.Tx, error) {
	pipe := &pgx.Batch{}
	pipe.BeginTx(txOptions)
	queue(pipe)
	results := conn.SendBatch(ctx, pipe)
	tx := results.Tx()
	if err := results.Close(); err != nil {
		endTx(tx, conn)
		return nil, err
	}
	return tx, nil
}

// endTx rolls tx back and hands its connection back to the pool; a
// connection whose rollback failed is closed instead (pgx destroys it).
func endTx(tx pgx.Tx, conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}

// Position returns the subscriber's committed checkpoint (0 if unknown):
// one indexed read, without a transaction or lock.
func (s *CheckpointStore) Position(ctx context.Context, subscriber string) (int64, error) {
	var position int64
	err := s.pool.QueryRow(ctx, s.stmt.position, subscriber).Scan(&position)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pgxstore: read checkpoint of %q: %w", subscriber, err)
	}
	return position, nil
}

// Reset sets the subscriber's checkpoint, creating the row if needed. It
// waits for the batch in flight, which holds the row. It is ResetWith
// without the application's statements.
func (s *CheckpointStore) Reset(ctx context.Context, subscriber string, position int64) error {
	return s.ResetWith(ctx, subscriber, position, nil)
}

// ResetWith runs apply and sets the subscriber's checkpoint to position in
// one transaction (see subscriptions.CheckpointResetter). The transaction
// writes the checkpoint row first, which waits for the batch in flight and
// then keeps every replica's Acquire skipping until the commit. apply gets
// the transaction from TxFromContext.
func (s *CheckpointStore) ResetWith(ctx context.Context, subscriber string, position int64, apply func(ctx context.Context) error) error {
	if err := subscriptions.CheckSubscriberName(subscriber); err != nil {
		return fmt.Errorf("pgxstore: reset: %w", err)
	}
	if position < 0 {
		return fmt.Errorf("pgxstore: reset checkpoint of %q: position %d is negative", subscriber, position)
	}
	what := fmt.Sprintf("reset checkpoint of %q to %d", subscriber, position)
	return s.fenced(ctx, what, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.stmt.resetRow, subscriber, position, time.Now().UTC()); err != nil {
			return err
		}
		return s.clearAttempts(ctx, tx, subscriber)
	}, apply)
}

// Delete runs apply and deletes the subscriber's checkpoint row, its
// pause, its catch-up mark and its attempt record in one transaction (see
// subscriptions.CheckpointResetter), holding off batches as ResetWith
// does.
func (s *CheckpointStore) Delete(ctx context.Context, subscriber string, apply func(ctx context.Context) error) error {
	if err := subscriptions.CheckSubscriberName(subscriber); err != nil {
		return fmt.Errorf("pgxstore: delete checkpoint: %w", err)
	}
	what := fmt.Sprintf("delete checkpoint of %q", subscriber)
	return s.fenced(ctx, what, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.stmt.deleteRow, subscriber); err != nil {
			return err
		}
		if err := s.clearKeyed(ctx, tx, subscriber); err != nil {
			return err
		}
		return s.clearAttempts(ctx, tx, subscriber)
	}, apply)
}

// clearAttempts deletes the names' attempt records: a reset or deleted
// checkpoint starts counting afresh.
func (s *CheckpointStore) clearAttempts(ctx context.Context, tx pgx.Tx, names ...string) error {
	if _, err := tx.Exec(ctx, s.stmt.clearAttempts, names); err != nil {
		return fmt.Errorf("clear the attempt count: %w", err)
	}
	return nil
}

// fenced runs write (the checkpoint change, first, so that it takes the
// row lock before apply runs) and apply in one transaction. When it
// returns, nothing of the transaction holds a lock any more, whether it
// committed, failed or was abandoned because ctx ended (see onServer).
func (s *CheckpointStore) fenced(ctx context.Context, what string, write func(ctx context.Context, tx pgx.Tx) error, apply func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	err := s.onServer(ctx, func(tctx context.Context, tx pgx.Tx) error {
		if err := write(tctx, tx); err != nil {
			return err
		}
		if apply == nil {
			return nil
		}
		htx := newHandlerTx(tx, s.pool)
		if err := errors.Join(apply(withTx(tctx, htx)), htx.misused()); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		return nil
	})
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			return fmt.Errorf("pgxstore: %s: %w: %w", what, ctxErr, err)
		}
		return fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	return nil
}

// onServer runs fn in a transaction on a connection of its own, with ctx's
// cancellation carried out on the server: the statements run without
// ctx's cancellation, and when ctx ends the statement running is cancelled
// by a cancel request, the transaction rolls back, and only then does
// onServer return. A driver that gave up by closing its socket would leave
// the server running the statement: a checkpoint write waiting for a
// batch's row lock would take that lock once the batch ended and hold it
// until the server noticed, so the caller's next Acquire could find the
// row locked by the abandoned transaction.
func (s *CheckpointStore) onServer(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	bg := context.WithoutCancel(ctx)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connection: %w", err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	var requested bool // written by the goroutine, read after done
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
		case <-stop:
			return
		}
		// Repeated until fn's transaction is over: a request that reaches
		// the server before the statement does cancels nothing, and the
		// statement could then wait for a batch's row lock for as long as
		// the batch holds it.
		ticker := time.NewTicker(cancelRetryInterval)
		defer ticker.Stop()
		for {
			requested = true
			cctx, cancel := context.WithTimeout(bg, 10*time.Second)
			_ = conn.Conn().PgConn().CancelRequest(cctx) // the next tick tries again
			cancel()
			select {
			case <-ticker.C:
			case <-stop:
				return
			}
		}
	}()
	// Deferred, so that the connection goes back even when fn does not
	// return (a panic, or runtime.Goexit in a test).
	defer func() {
		close(stop)
		<-done
		if requested {
			// A request may still reach the server after the statement
			// it was meant for: the connection is not reused.
			_ = conn.Conn().Close(bg)
		}
		conn.Release()
	}()
	err = pgx.BeginTxFunc(bg, conn, txOptions, func(tx pgx.Tx) error {
		if err := fn(bg, tx); err != nil {
			return err
		}
		return ctx.Err() // abandoned after the last statement: roll back
	})
	return err
}

// Pause records key as paused, committed, and then waits until no batch of
// names is in flight by locking their rows in name order (a batch in
// flight holds its row; one that locked its row before the pause
// committed fails its commit, which checks the pause again). The
// positions are read once that holds.
func (s *CheckpointStore) Pause(ctx context.Context, key string, names []string, reason string) ([]int64, error) {
	what := fmt.Sprintf("pause %q", key)
	if _, err := s.pool.Exec(ctx, s.stmt.pause, key, time.Now().UTC(), reason); err != nil {
		return nil, fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	found := map[string]int64{}
	err := s.onServer(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.stmt.lockPaused, sorted)
		if err != nil {
			return err
		}
		var name string
		var position int64
		_, err = pgx.ForEachRow(rows, []any{&name, &position}, func() error {
			found[name] = position
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pgxstore: %s: recorded, but waiting for the batches in flight failed (Resume lifts the pause): %w", what, err)
	}
	out := make([]int64, len(names))
	for i, name := range names {
		out[i] = found[name]
	}
	return out, nil
}

// Resume lifts key's pause.
func (s *CheckpointStore) Resume(ctx context.Context, key string) error {
	if _, err := s.pool.Exec(ctx, s.stmt.resume, key); err != nil {
		return fmt.Errorf("pgxstore: resume %q: %w", key, err)
	}
	return nil
}

// PausedSince reports whether key is paused, since when and why.
func (s *CheckpointStore) PausedSince(ctx context.Context, key string) (subscriptions.PauseRecord, bool, error) {
	var rec subscriptions.PauseRecord
	err := s.pool.QueryRow(ctx, s.stmt.pausedSince, key).Scan(&rec.Since, &rec.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return subscriptions.PauseRecord{}, false, nil
	}
	if err != nil {
		return subscriptions.PauseRecord{}, false, fmt.Errorf("pgxstore: read the pause of %q: %w", key, err)
	}
	rec.Since = rec.Since.UTC()
	return rec, true, nil
}
