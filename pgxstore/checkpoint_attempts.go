package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
)

// The attempt records of subscriptions.AttemptCounter are rows of
// subscriber_attempts, one per checkpoint row, with the same claim
// protocol as the GORM Postgres backend, so that replicas of both kinds
// count one attempt count: a batch writes its record in its own
// transaction, commits it, begins again on the same connection and locks
// its checkpoint row again (renew), so the record is committed before the
// handlers run and the batch never needs a second connection. In the
// moment between, another replica can lock the row; the record's claim
// (holder: the runner; holder_pid: the server process of the connection
// that wrote it; claimed_at: the server's clock) keeps it out while it is
// live: its process is still there and it is younger than
// attemptClaimLease. A crash ends the claim with the process's
// connections, a rolled-back batch releases its claim at once, and the
// lease bounds what neither covers.

// attemptClaimLease bounds how long an attempt claim keeps other replicas
// from a checkpoint whose row nobody locks. It only has to outlast the
// moment between the record's commit and the row locked again (which
// waits up to relockTimeout).
const attemptClaimLease = 10 * time.Second

// relockTimeout bounds the wait for the checkpoint row in renew: the row
// is only held in the moment another replica looks at a claimed record,
// or by a reset.
const relockTimeout = "5s"

var _ subscriptions.AttemptCounter = (*CheckpointStore)(nil)

// liveClaim is true while another runner than the holder $h claims the
// row, for an attempt from checkpoint $c or for a commit past it: the
// claim is younger than the lease and the server process that wrote it is
// still there. h and c are the placeholders' numbers. It names the
// record's table by its bare name, as the statement's FROM or INSERT
// target it joins, in any schema.
func liveClaim(h, c int) string {
	return fmt.Sprintf(`(subscriber_attempts.holder <> '' AND subscriber_attempts.holder <> $%d AND subscriber_attempts.position >= $%d
		AND subscriber_attempts.claimed_at > statement_timestamp() - interval '%d milliseconds'
		AND EXISTS (SELECT 1 FROM pg_stat_get_activity(subscriber_attempts.holder_pid)))`, h, c, attemptClaimLease.Milliseconds())
}

func attemptArgs(subscriber string, rec subscriptions.AttemptRecord) []any {
	return []any{subscriber, rec.Position, rec.EventID, rec.Through, rec.Attempts, rec.LastError, time.Now().UTC(), rec.Holder}
}

// errNothingToWrite ends a renew without a write to commit.
var errNothingToWrite = errors.New("nothing to write")

// errAttemptMoved is the error of a record written while the checkpoint
// moved: the batch is given up as on ErrCheckpointMoved.
var errAttemptMoved = fmt.Errorf("recording the attempt: %w", subscriptions.ErrCheckpointMoved)

// BeginAttempt implements subscriptions.AttemptCounter: one statement on
// the common path, which writes unless a record of an earlier attempt at
// rec or another runner's live claim is there.
func (s *CheckpointStore) BeginAttempt(ctx context.Context, in subscriptions.Batch, subscriber string, rec subscriptions.AttemptRecord) (subscriptions.AttemptRecord, bool, error) {
	var prev subscriptions.AttemptRecord
	found := false
	err := s.attemptWrite(ctx, in, subscriber, rec.Holder, func(tx pgx.Tx, checkpoint int64) error {
		rows, err := tx.Query(ctx, s.stmt.beginAttempt, append(attemptArgs(subscriber, rec), rec.Holder, checkpoint)...)
		if err != nil {
			return err
		}
		wrote, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return err
		}
		if len(wrote) == 1 {
			return nil
		}
		var claimed bool
		err = tx.QueryRow(ctx, s.stmt.readAttempt, rec.Holder, checkpoint, subscriber).Scan(&prev.Position, &prev.EventID, &prev.Through, &prev.Attempts, &prev.LastError, &prev.Holder, &claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			return errors.New("the record vanished")
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if claimed {
			return subscriptions.ErrAttemptClaimed
		}
		found = true
		return errNothingToWrite
	})
	if err != nil {
		return subscriptions.AttemptRecord{}, false, err
	}
	return prev, found, nil
}

// PutAttempt implements subscriptions.AttemptCounter.
func (s *CheckpointStore) PutAttempt(ctx context.Context, in subscriptions.Batch, subscriber string, rec subscriptions.AttemptRecord) error {
	return s.attemptWrite(ctx, in, subscriber, rec.Holder, func(tx pgx.Tx, checkpoint int64) error {
		tag, err := tx.Exec(ctx, s.stmt.putAttempt, append(attemptArgs(subscriber, rec), rec.Holder, checkpoint)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return subscriptions.ErrAttemptClaimed
		}
		return nil
	})
}

// attemptWrite runs write in batch's transaction and commits it before it
// returns (renew), unless write answers errNothingToWrite. A record with
// a holder is the batch's claim, which its Commit and Rollback release.
func (s *CheckpointStore) attemptWrite(ctx context.Context, in subscriptions.Batch, subscriber, holder string, write func(tx pgx.Tx, checkpoint int64) error) error {
	b, ok := in.(*batch)
	if !ok || b.store != s {
		return fmt.Errorf("pgxstore: record an attempt of %q: not a batch of this store", subscriber)
	}
	wrote, err := b.renew(ctx, func(tx pgx.Tx) error { return write(tx, b.position) })
	if wrote && holder != "" {
		b.claim = holder
	}
	if err != nil {
		return fmt.Errorf("pgxstore: record an attempt of %q: %w", subscriber, err)
	}
	return nil
}

// renew runs write in the batch's transaction, commits it, begins the
// next one on the batch's connection and locks the checkpoint row again,
// waiting for it up to relockTimeout. wrote is false when write answered
// errNothingToWrite. If the checkpoint moved in between (a reset, or
// another replica's commit), renew fails with errAttemptMoved; if the
// name was paused, with ErrAttemptClaimed (as if held). It must run
// before the first HandlerContext.
func (b *batch) renew(ctx context.Context, write func(tx pgx.Tx) error) (wrote bool, err error) {
	if b.htx != nil {
		return false, errors.New("the batch's handlers have started")
	}
	b.attempt = prefetchedAttempt{}
	if b.tx == nil {
		return false, errAttemptMoved
	}
	if err := write(b.tx); err != nil {
		if errors.Is(err, errNothingToWrite) {
			return false, nil
		}
		return false, err
	}
	if err := b.tx.Commit(ctx); err != nil {
		b.tx = nil
		return false, fmt.Errorf("commit: %w", err)
	}
	tx, err := b.conn.BeginTx(ctx, txOptions)
	if err != nil {
		b.tx = nil
		return true, fmt.Errorf("begin again: %w", err)
	}
	b.tx = tx
	var position *int64
	var paused bool
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '"+relockTimeout+"'")
	if err == nil {
		err = tx.QueryRow(ctx, b.store.stmt.relockRow, b.subscriber, subscriptions.PauseKey(b.subscriber)).Scan(&position, &paused)
	}
	if err == nil {
		_, err = tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT")
	}
	if err != nil {
		return true, fmt.Errorf("take the checkpoint again: %w", err)
	}
	if position == nil || *position != b.position {
		return true, errAttemptMoved
	}
	if paused {
		return true, subscriptions.ErrAttemptClaimed
	}
	return true, nil
}

// FailAttempt implements subscriptions.AttemptCounter: it ends the batch's
// transaction, writes the failure on the batch's connection in a
// statement of its own, and only then releases the connection, replacing
// the batch's claim, if any, with the failure.
func (s *CheckpointStore) FailAttempt(ctx context.Context, in subscriptions.Batch, subscriber string, rec subscriptions.AttemptRecord) error {
	if in == nil {
		return s.failAttemptRow(ctx, s.pool, subscriber, rec)
	}
	b, ok := in.(*batch)
	if !ok || b.store != s {
		_ = in.Rollback()
		return fmt.Errorf("pgxstore: record the failure of event %q of %q: not a batch of this store", rec.EventID, subscriber)
	}
	if b.finished {
		return fmt.Errorf("pgxstore: record the failure of event %q of %q: %w", rec.EventID, subscriber, subscriptions.ErrBatchFinished)
	}
	b.finished = true
	if b.tx != nil {
		err := b.tx.Rollback(ctx)
		if err == nil || errors.Is(err, pgx.ErrTxClosed) {
			defer b.conn.Release()
			return s.failAttemptRow(ctx, b.conn, subscriber, rec)
		}
	}
	// No transaction to end (a renew could not begin again) or a failed
	// rollback: the connection is suspect. It is closed and handed back
	// before the failure is written on the pool, so that nothing waits
	// for a second connection while it holds one.
	_ = b.conn.Conn().Close(ctx)
	b.conn.Release()
	return s.failAttemptRow(ctx, s.pool, subscriber, rec)
}

// failAttemptRow writes the failure rec records, unclaimed: on the record
// of the same attempt keeping its count, else as a new record of
// rec.Attempts. Another runner's live claim is left alone: that runner
// is attempting now and counts on its own.
func (s *CheckpointStore) failAttemptRow(ctx context.Context, q querier, subscriber string, rec subscriptions.AttemptRecord) error {
	_, err := q.Exec(ctx, s.stmt.failAttempt, subscriber, rec.Position, rec.EventID, rec.Through, rec.Attempts, rec.LastError, time.Now().UTC(), rec.Holder, rec.Position)
	if err != nil {
		return fmt.Errorf("pgxstore: record the failure of event %q of %q: %w", rec.EventID, subscriber, err)
	}
	return nil
}

// HasAttempt implements subscriptions.AttemptCounter, reading in the
// batch's transaction.
func (s *CheckpointStore) HasAttempt(ctx context.Context, in subscriptions.Batch, subscriber string, position int64) (bool, error) {
	b, ok := in.(*batch)
	if !ok || b.store != s || b.tx == nil {
		return false, fmt.Errorf("pgxstore: read the attempt record of %q: not a live batch of this store", subscriber)
	}
	if has, ok := b.attempt.take(subscriber == b.subscriber, position); ok {
		return has, nil
	}
	var found bool
	if err := b.tx.QueryRow(ctx, s.stmt.hasAttempt, subscriber, position).Scan(&found); err != nil {
		return false, fmt.Errorf("pgxstore: read the attempt record of %q: %w", subscriber, err)
	}
	return found, nil
}

// ClearAttempt implements subscriptions.AttemptCounter: the record is gone
// once the batch commits.
func (s *CheckpointStore) ClearAttempt(ctx context.Context, in subscriptions.Batch, subscriber string) error {
	b, ok := in.(*batch)
	if !ok || b.store != s || b.tx == nil {
		return fmt.Errorf("pgxstore: clear the attempt count of %q: not a live batch of this store", subscriber)
	}
	b.attempt = prefetchedAttempt{}
	if _, err := b.tx.Exec(ctx, s.stmt.clearAttempt, subscriber); err != nil {
		return fmt.Errorf("pgxstore: clear the attempt count of %q: %w", subscriber, err)
	}
	return nil
}

// releaseClaim gives up the claim the batch wrote, once its transaction
// has rolled back: the record stays, an attempt that did not complete,
// and the next replica counts on from it at once instead of waiting for
// the claim to age.
func (b *batch) releaseClaim(ctx context.Context) error {
	if _, err := b.conn.Exec(ctx, b.store.stmt.releaseClaim, b.subscriber, b.claim); err != nil {
		return fmt.Errorf("pgxstore: release the attempt claim of %q: %w", b.subscriber, err)
	}
	return nil
}
