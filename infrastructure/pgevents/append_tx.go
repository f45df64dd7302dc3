package pgevents

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/eventfeed/subscriptions/domain"
)

// appendSavepoint is the savepoint an append inside a caller's
// transaction runs under, so that a refused append leaves the caller's
// transaction usable.
const appendSavepoint = "pgevents_append"

// ErrNotReadCommitted is wrapped by the error of an append inside a
// caller's transaction that does not run at READ COMMITTED: only a
// statement that starts after the append lock was granted, under READ
// COMMITTED, sees every append committed before it, and a snapshot taken
// earlier would reuse a committed position.
var ErrNotReadCommitted = errors.New("appending inside a transaction needs READ COMMITTED")

// AppendInTx stores events for one aggregate atomically inside tx, a
// transaction the caller owns and ends, under a savepoint of its own: as
// Append does, with the same append lock, version check and NOTIFY, which
// Postgres delivers when the caller commits. It is never coalesced. The
// lock is held until the caller's transaction ends: every other append
// to the table waits for it, so the transaction should end soon after.
// prepared is what PrepareAppend returned for events with an unknown
// version (-1); events must not be empty. When the append is refused (a
// version conflict, a stored event ID), nothing of it is left in tx and
// the caller's transaction goes on; when a statement fails for another
// reason, tx may be unusable, as after any failed statement. tx belongs
// to the caller's goroutine for the call.
func (a *Appender) AppendInTx(ctx context.Context, tx pgx.Tx, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], prepared []Prepared) error {
	m := &appendRequest{aggregateID: aggregateID, expectedVersion: expectedVersion, events: events, prepared: prepared}
	wrap := func(err error) error {
		return fmt.Errorf("append %d event(s) to aggregate %q in the caller's transaction: %w", len(events), aggregateID, err)
	}
	var level string
	check := &pgx.Batch{}
	check.Queue("SELECT current_setting('transaction_isolation')").QueryRow(func(row pgx.Row) error { return row.Scan(&level) })
	check.Queue("SAVEPOINT " + appendSavepoint)
	if err := tx.SendBatch(ctx, check).Close(); err != nil {
		return wrap(err)
	}
	undo := func(cause error) error {
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+appendSavepoint); err != nil {
			return wrap(errors.Join(cause, fmt.Errorf("roll back to its savepoint: %w", err)))
		}
		return nil
	}
	if level != "read committed" {
		return errors.Join(wrap(fmt.Errorf("%w, and the transaction runs at %q (begin it with pgx.TxOptions{IsoLevel: pgx.ReadCommitted})", ErrNotReadCommitted, level)), undo(nil))
	}
	required, ok := requiredVersion(m)
	if !ok {
		return a.explainInTx(ctx, tx, m, undo(nil))
	}
	insert := checkedInsert(a.table.sql, aggregateID, required, prepared)
	write := &pgx.Batch{}
	write.Queue("SELECT pg_advisory_xact_lock($1)", a.table.LockKey())
	var inserted int64
	write.Queue(insert.sql, insert.args...).Exec(func(tag pgconn.CommandTag) error {
		inserted = tag.RowsAffected()
		return nil
	})
	write.Queue("SELECT pg_notify($1, '')", a.channel)
	if err := tx.SendBatch(ctx, write).Close(); err != nil {
		if uerr := undo(err); uerr != nil {
			return uerr
		}
		err = InsertError(aggregateID, err)
		if errors.Is(err, domain.ErrInvalidEvent) {
			// An event ID is stored: the retry of an append that
			// committed, or another event under that ID.
			stored := map[string]Stored{}
			if rerr := readStored(ctx, tx.Conn(), a.table.sql, []*appendRequest{m}, stored); rerr != nil {
				return wrap(fmt.Errorf("%v; then: %w", err, rerr))
			}
			if classified := CheckStoredIDs(aggregateID, expectedVersion, events, prepared, stored); classified != nil {
				return classified
			}
		}
		if definite(err) {
			return err
		}
		return wrap(err)
	}
	if inserted != int64(len(events)) {
		return a.explainInTx(ctx, tx, m, undo(nil))
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+appendSavepoint); err != nil {
		return wrap(err)
	}
	return nil
}

// explainInTx answers for an append inside a caller's transaction that
// inserted nothing (explainRefusals), after its savepoint was rolled
// back (undone reports how that went).
func (a *Appender) explainInTx(ctx context.Context, tx pgx.Tx, m *appendRequest, undone error) error {
	if undone != nil {
		return undone
	}
	results := map[*appendRequest]error{}
	explainRefusals(ctx, tx.Conn(), a.table.sql, []*appendRequest{m}, results)
	return results[m]
}
