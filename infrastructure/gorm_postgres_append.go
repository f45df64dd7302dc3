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

// appendPipelined appends through the coalescer: alone when no other
// append of this store waits for the lock, in a shared transaction
// otherwise.
func (s *GormEventStore) appendPipelined(ctx context.Context, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any]) error {
	return s.coalescer.run(&appendRequest{ctx: ctx, aggregateID: aggregateID, expectedVersion: expectedVersion, events: events}, s.runBatch)
}

// runBatch is one append transaction for a batch of appends, delivering
// each member's outcome. When a full notification queue refuses the
// NOTIFY, the batch runs again without it: notifications are wake-ups,
// subscribers poll anyway.
func (s *GormEventStore) runBatch(b *appendBatch) {
	defer b.cancel()
	results := s.appendBatchOnce(b, nil, true)
	var retry []*appendRequest
	for m, err := range results {
		if isNotifyFailure(err) {
			retry = append(retry, m)
		}
	}
	if len(retry) > 0 {
		for m, err := range s.appendBatchOnce(b, retry, false) {
			results[m] = err
		}
	}
	for m, err := range results {
		m.done <- err
	}
}

// appendBatchOnce runs the append transaction on one pgx connection: for
// the coalescer's batch b (members nil: whoever joins before the lock is
// granted) or for the given members only. It returns every member's
// outcome.
//
// The statements are those of the portable path (appendOnce), pipelined
// into two network round trips instead of six: BEGIN, the append lock and
// the reads (the feed head, the members' versions, their event IDs) go out
// as one pgx batch; the INSERTs, the NOTIFY and the COMMIT as a second.
// The reads are statements that start after the lock is granted, under
// READ COMMITTED, so they see every earlier append: the feed's soundness
// argument is the portable path's. Appends that joined while the lock was
// awaited cost one more round trip, for their own reads.
//
// Commit latency is what a subscriber's wake-up waits for, which is why
// the append is worth the pipelining.
func (s *GormEventStore) appendBatchOnce(b *appendBatch, members []*appendRequest, notify bool) map[*appendRequest]error {
	ctx := b.ctx
	results := map[*appendRequest]error{}
	fail := func(reqs []*appendRequest, err error) map[*appendRequest]error {
		for _, m := range reqs {
			if errors.Is(err, errNotPgx) {
				results[m] = errNotPgx
			} else {
				results[m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
			}
		}
		return results
	}
	first := members
	if first == nil {
		first = s.coalescer.snapshot(b)
	}
	conn, err := s.pool.Conn(ctx)
	if err != nil {
		if members == nil {
			members = s.coalescer.close(b)
		}
		return fail(members, err)
	}
	defer conn.Close()
	var inner map[*appendRequest]error
	err = conn.Raw(func(dc any) error {
		pc, ok := pgxconn.Unwrap(dc)
		if !ok {
			if members == nil {
				members = s.coalescer.close(b)
			}
			return errNotPgx
		}
		inner = s.appendOnConn(ctx, pc, b, first, members, notify)
		// Never hand a connection back to the pool inside a transaction.
		return pgxconn.EndSession(ctx, pc, nil)
	})
	if inner != nil && !errors.Is(err, errNotPgx) {
		// A connection that could not be cleaned up (driver.ErrBadConn)
		// is dropped by database/sql; the outcomes stand.
		return inner
	}
	if members == nil {
		members = s.coalescer.close(b)
	}
	if err == nil || errors.Is(err, driver.ErrBadConn) {
		err = fmt.Errorf("no outcome from the append transaction: %w", err)
	}
	return fail(members, err)
}

// batchReads is what an append needs to know under the lock.
type batchReads struct {
	head     int64
	versions map[string]int
	stored   map[string]storedEvent
}

const (
	// selectHeads reads the feed head and the versions of the aggregates
	// in $1: one statement, whatever the number of aggregates.
	selectHeads = `SELECT a.id,
		(SELECT COALESCE(MAX(sequence_no), 0) FROM events WHERE aggregate_id = a.id),
		(SELECT COALESCE(MAX(position), 0) FROM events)
		FROM unnest($1::text[]) AS a(id)`
	selectStored = `SELECT id, aggregate_id, event_type, transaction_id, sequence_no, payload FROM events WHERE id = ANY($1)`
)

// queueHeads adds the read of the head and of reqs' versions.
func queueHeads(batch *pgx.Batch, reqs []*appendRequest) {
	aggs := make([]string, 0, len(reqs))
	for _, m := range reqs {
		aggs = append(aggs, m.aggregateID)
	}
	batch.Queue(selectHeads, aggs)
}

// scanHeads reads the result of queueHeads into r.
func scanHeads(br pgx.BatchResults, r *batchReads) error {
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("read versions: %w", err)
	}
	for rows.Next() {
		var agg string
		var version int
		if err := rows.Scan(&agg, &version, &r.head); err != nil {
			rows.Close()
			return fmt.Errorf("read versions: %w", err)
		}
		r.versions[agg] = version
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read versions: %w", err)
	}
	return nil
}

// readStored reads the stored events among reqs' event IDs (see
// checkStoredIDs). Only appends that failed a version check or hit a
// stored ID need it, so it is off the common path.
func readStored(ctx context.Context, pc *pgx.Conn, reqs []*appendRequest, into map[string]storedEvent) error {
	var ids []string
	for _, m := range reqs {
		for _, ev := range m.events {
			ids = append(ids, ev.ID)
		}
	}
	rows, err := pc.Query(ctx, selectStored, ids)
	if err != nil {
		return fmt.Errorf("read stored event IDs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e storedEvent
		if err := rows.Scan(&e.ID, &e.AggregateID, &e.EventType, &e.TransactionID, &e.SequenceNo, &e.Payload); err != nil {
			return fmt.Errorf("read stored event IDs: %w", err)
		}
		into[e.ID] = e
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read stored event IDs: %w", err)
	}
	return nil
}

// appendOnConn runs the transaction on pc. first are the members whose
// reads go out with the lock; members, when nil, are decided by closing
// the coalescer's batch once the lock is granted.
func (s *GormEventStore) appendOnConn(ctx context.Context, pc *pgx.Conn, b *appendBatch, first, members []*appendRequest, notify bool) map[*appendRequest]error {
	results := map[*appendRequest]error{}
	fail := func(reqs []*appendRequest, err error) map[*appendRequest]error {
		for _, m := range reqs {
			results[m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
		}
		return results
	}
	reads := batchReads{versions: map[string]int{}, stored: map[string]storedEvent{}}
	lock := &pgx.Batch{}
	lock.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	lock.Queue("SELECT pg_advisory_xact_lock($1)", s.lockKey)
	queueHeads(lock, first)
	br := pc.SendBatch(ctx, lock)
	_, err := br.Exec()
	if err == nil {
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("take append lock: %w", err)
		}
	}
	// The lock is granted (or the transaction failed): membership is
	// final either way.
	if members == nil {
		members = s.coalescer.close(b)
	}
	if err == nil {
		err = scanHeads(br, &reads)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fail(members, err)
	}
	// Members that joined while the lock was awaited read their versions
	// now, under the lock: one more round trip, shared by all of them.
	var late []*appendRequest
	for _, m := range members {
		if _, ok := reads.versions[m.aggregateID]; !ok {
			late = append(late, m)
		}
	}
	if len(late) > 0 {
		more := &pgx.Batch{}
		queueHeads(more, late)
		br := pc.SendBatch(ctx, more)
		err := scanHeads(br, &reads)
		if cerr := br.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return fail(members, err)
		}
	}

	// A failed version check may be the retry of an append that
	// committed: those appends' event IDs are looked up, still under the
	// lock, before any check is final.
	var conflicted []*appendRequest
	for _, m := range members {
		if _, err := prepareAppend(m.aggregateID, m.expectedVersion, reads.versions[m.aggregateID], m.events); errors.Is(err, domain.ErrConcurrencyConflict) {
			conflicted = append(conflicted, m)
		}
	}
	if len(conflicted) > 0 {
		if err := readStored(ctx, pc, conflicted, reads.stored); err != nil {
			return fail(members, err)
		}
	}

	// Each member's own checks, in arrival order; accepted ones take the
	// next positions.
	var (
		accepted []*appendRequest
		rows     []preparedEvent
	)
	for _, m := range members {
		if err := checkStoredIDs(m.aggregateID, m.expectedVersion, m.events, reads.stored); err != nil {
			results[m] = err
			continue
		}
		prepared, err := prepareAppend(m.aggregateID, m.expectedVersion, reads.versions[m.aggregateID], m.events)
		if err != nil {
			results[m] = err
			continue
		}
		accepted = append(accepted, m)
		rows = append(rows, prepared...)
	}
	if len(accepted) == 0 {
		return results
	}

	write := &pgx.Batch{}
	inserts := insertStatements(rows, reads.head, true, true)
	for _, stmt := range inserts {
		write.Queue(stmt.sql, stmt.args...)
	}
	if notify {
		write.Queue("SELECT pg_notify($1, '')", PostgresNotifyChannel)
	}
	write.Queue("COMMIT")
	br = pc.SendBatch(ctx, write)
	defer br.Close()
	for range inserts {
		if _, err := br.Exec(); err != nil {
			if len(accepted) == 1 {
				m := accepted[0]
				err = s.insertError(m.aggregateID, err)
				if errors.Is(err, domain.ErrInvalidEvent) {
					// An event ID is stored: the retry of an append that
					// committed, or another event under that ID. Stored
					// events never change, so this is decided after the
					// rollback.
					_ = br.Close()
					if cerr := pgxconn.EndSession(ctx, pc, nil); cerr == nil {
						stored := map[string]storedEvent{}
						if rerr := readStored(ctx, pc, accepted, stored); rerr == nil {
							if classified := checkStoredIDs(m.aggregateID, m.expectedVersion, m.events, stored); classified != nil {
								err = classified
							}
						}
					}
				}
				if !errors.Is(err, domain.ErrInvalidEvent) && !errors.Is(err, domain.ErrConcurrencyConflict) && !errors.Is(err, domain.ErrAlreadyAppended) {
					err = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
				}
				results[m] = err
				return results
			}
			// Not committed. Find whose rows the database refused by
			// running the accepted appends one by one.
			_ = br.Close()
			for i, m := range accepted {
				if err := pgxconn.EndSession(ctx, pc, nil); err != nil {
					return fail(accepted[i:], err)
				}
				for mm, err := range s.appendOnConn(ctx, pc, nil, []*appendRequest{m}, []*appendRequest{m}, notify) {
					results[mm] = err
				}
			}
			return results
		}
	}
	if notify {
		if _, err := br.Exec(); err != nil {
			for _, m := range accepted {
				results[m] = notifyError{err}
			}
			return results
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("the transaction was rolled back (%s)", tag.String())
	}
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		if isNotifyFailure(err) {
			for _, m := range accepted {
				results[m] = err
			}
			return results
		}
		return fail(accepted, fmt.Errorf("commit: %w", err))
	}
	for _, m := range accepted {
		results[m] = nil
	}
	return results
}
