package pgxstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// Replay re-runs handler for a parked event and clears the entry, both in
// one transaction of the lot's pool: a failed replay leaves the entry and
// rolls back the handler's writes. The handler gets the transaction
// through TxFromContext (its Commit and Rollback refused, as in a batch);
// one that ends it anyway, with a COMMIT, ROLLBACK or END statement, fails
// the replay and the entry stays.
//
// The handler runs at most once per parked entry, whichever lots replay
// it (this one and subscriptions.GormParkingLot lock the same row): the
// entry's row is locked FOR NO KEY UPDATE SKIP LOCKED, so a second replay, or a
// Discard, finds it busy and returns an error wrapping
// subscriptions.ErrReplayInProgress at once without running its handler,
// and the delete must remove the row (a replay that finds it gone
// meanwhile fails with ErrReplayInProgress). An entry that is not parked
// is an error wrapping subscriptions.ErrEventNotParked. The transaction is
// READ COMMITTED whatever the server's default, so that a skipped row is
// told apart from a gone one, and a Park queued behind the lock updates
// the row it then finds.
func (l *ParkingLot) Replay(ctx context.Context, subscriber, eventID string, event domain.EventEnvelope[any], handler subscriptions.Handler) error {
	if handler == nil {
		return fmt.Errorf("pgxstore: replay event %q for %q: nil handler", eventID, subscriber)
	}
	fail := func(what string, err error) error {
		if what != "" {
			return fmt.Errorf("pgxstore: replay event %q for %q: %s: %w", eventID, subscriber, what, err)
		}
		return fmt.Errorf("pgxstore: replay event %q for %q: %w", eventID, subscriber, err)
	}
	key := entryKey(subscriber, eventID)
	var failure error // the replay's own answer, kept apart from pgx's wrapping of it
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		// FOR NO KEY UPDATE, not FOR UPDATE: a batch holding an event behind
		// this entry (Hold's FOR KEY SHARE) is not kept waiting.
		var aggregate string
		err := tx.QueryRow(ctx, l.stmt.lockEntry, key, subscriber, eventID).Scan(&aggregate)
		found := err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if err != nil {
			failure = fail("lock parked row", err)
			return failure
		}
		if !found {
			// Skipped: absent, or locked by another transaction.
			exists, err := rowExists(ctx, tx, l.stmt.entryExists, key, subscriber, eventID)
			if err != nil {
				failure = fail("read parked row", err)
				return failure
			}
			if exists {
				failure = fail("", subscriptions.ErrReplayInProgress)
			} else {
				failure = fail("", subscriptions.ErrEventNotParked)
			}
			return failure
		}
		htx := newHandlerTx(tx, l.pool)
		herr := handler(withTx(ctx, htx), event)
		if ended(tx.Conn().PgConn()) {
			herr = errors.Join(herr, fmt.Errorf("a statement of the handler ended the replay's transaction: %w", ErrTxOwnedByBatch))
		}
		if herr != nil {
			failure = fail("", herr)
			return failure
		}
		if err := htx.misused(); err != nil {
			failure = fail("", err)
			return failure
		}
		tag, err := tx.Exec(ctx, l.stmt.deleteEntry, key, subscriber, eventID)
		if err != nil {
			failure = fail("clear parked row", err)
			return failure
		}
		if tag.RowsAffected() != 1 {
			failure = fail("the entry was cleared meanwhile", subscriptions.ErrReplayInProgress)
			return failure
		}
		if err := l.promote(ctx, tx, subscriber, aggregate); err != nil {
			failure = fail("", err)
			return failure
		}
		return nil
	})
	switch {
	case err == nil:
		return nil
	case failure != nil:
		// The replay failed: pgx rolled back. A failed rollback (the
		// connection is then closed, which ends the transaction too) does
		// not change the answer.
		return failure
	default:
		return fail("", err) // begin or commit
	}
}

// rowExists reports whether query finds a row.
func rowExists(ctx context.Context, q querier, query string, args ...any) (bool, error) {
	var one int
	err := q.QueryRow(ctx, query, args...).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
