package infrastructure

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/pgxconn"
)

// errNotPgx reports that the pool's driver connection is not pgx (a
// *gorm.DB opened on another Postgres driver), so the append falls back
// to the portable path.
var errNotPgx = errors.New("connection is not a pgx connection")

// appendPipelined is the Postgres append in two network round trips
// instead of six: BEGIN, the append lock and the read of the aggregate's
// version and the feed head go out as one pgx batch; the INSERT, the NOTIFY
// and the COMMIT as a second. The statements and their order are those of
// the portable path (appendOnce), so the feed's soundness argument is the
// same: the heads are read in a statement that starts after the lock is
// granted, under READ COMMITTED, so they include every earlier append.
//
// Commit latency is what a subscriber's wake-up waits for, which is why
// the append is worth the pipelining.
func (s *GormEventStore) appendPipelined(ctx context.Context, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], notify bool) error {
	conn, err := s.pool.Conn(ctx)
	if err != nil {
		return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(events), aggregateID, err)
	}
	defer conn.Close()
	var appendErr error
	err = conn.Raw(func(dc any) error {
		pc, ok := pgxconn.Unwrap(dc)
		if !ok {
			return errNotPgx
		}
		appendErr = s.appendOnConn(ctx, pc, aggregateID, expectedVersion, events, notify)
		// Never hand a connection back to the pool inside a transaction.
		return pgxconn.EndSession(ctx, pc, nil)
	})
	if err != nil && !errors.Is(err, driver.ErrBadConn) {
		return err
	}
	return appendErr
}

const selectHeads = `SELECT
	(SELECT COALESCE(MAX(sequence_no), 0) FROM events WHERE aggregate_id = $1),
	(SELECT COALESCE(MAX(position), 0) FROM events)`

func (s *GormEventStore) appendOnConn(ctx context.Context, conn *pgx.Conn, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], notify bool) error {
	first := &pgx.Batch{}
	first.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	first.Queue("SELECT pg_advisory_xact_lock($1)", s.lockKey)
	first.Queue(selectHeads, aggregateID)
	var version int
	var head int64
	br := conn.SendBatch(ctx, first)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
		if err != nil {
			err = fmt.Errorf("take append lock: %w", err)
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&version, &head)
		if err != nil {
			err = fmt.Errorf("read versions: %w", err)
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(events), aggregateID, err)
	}

	prepared, err := prepareAppend(aggregateID, expectedVersion, version, events)
	if err != nil {
		return err
	}
	second := &pgx.Batch{}
	inserts := insertStatements(prepared, head, true, true)
	for _, stmt := range inserts {
		second.Queue(stmt.sql, stmt.args...)
	}
	if notify {
		second.Queue("SELECT pg_notify($1, '')", PostgresNotifyChannel)
	}
	second.Queue("COMMIT")
	br = conn.SendBatch(ctx, second)
	defer br.Close()
	for range inserts {
		if _, err := br.Exec(); err != nil {
			return s.insertError(aggregateID, err)
		}
	}
	if notify {
		if _, err := br.Exec(); err != nil {
			return notifyError{err}
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("append %d event(s) to aggregate %q: commit: %w", len(events), aggregateID, err)
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("append %d event(s) to aggregate %q: commit: the transaction was rolled back (%s)", len(events), aggregateID, tag.String())
	}
	return br.Close()
}
