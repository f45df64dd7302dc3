package infrastructure

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/pgxconn"
)

// errNotPgx reports that the pool's driver connection is not pgx (a
// *gorm.DB opened on another Postgres driver), so the append falls back
// to the portable path.
var errNotPgx = errors.New("connection is not a pgx connection")

// appendPipelined appends through the coalescer: alone when the store's
// appends are not queued for the lock, in a shared transaction otherwise.
// prepared is the call's events as Append validated and encoded them
// (prepareAppend with an unknown version): the batch goroutine reads those
// and a copy of the envelopes without their payloads and metadata, never
// the caller's values, which the caller owns again once Append returns.
func (s *GormEventStore) appendPipelined(ctx context.Context, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], prepared []preparedEvent) error {
	own := make([]domain.EventEnvelope[any], len(events))
	for i, ev := range events {
		ev.Payload, ev.Metadata = nil, nil
		own[i] = ev
	}
	return s.coalescer.run(&appendRequest{ctx: ctx, aggregateID: aggregateID, expectedVersion: expectedVersion, events: own, prepared: prepared}, s.runBatch)
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
	for _, m := range b.members {
		err, ok := results[m]
		if !ok {
			// Every path above should have answered; never leave a
			// caller waiting for an answer that will not come.
			err = fmt.Errorf("append %d event(s) to aggregate %q: internal error: the append transaction gave no outcome for this append, which may or may not be stored: retry the same call", len(m.events), m.aggregateID)
		}
		m.done <- err
	}
}

// appendBatchOnce runs the append transaction on one pgx connection, for
// the closed batch b's members or, when members is set, for those only
// (the NOTIFY-less retry). It returns every member's outcome.
//
// The transaction is one network round trip, pipelined with pgx, however
// many appends share it (appendOnConn). Each INSERT checks its append's
// version and numbers its rows in the database (checkedInsert), in a
// statement that starts after the lock was granted, under READ COMMITTED,
// so it sees every earlier append: the feed's soundness argument is the
// portable path's (appendOnce). An append whose check fails inserts
// nothing and is told why after the commit (explainRefusals).
//
// Commit latency is what a subscriber's wake-up waits for, and the lock is
// held through it, which is why the append is worth the pipelining.
func (s *GormEventStore) appendBatchOnce(b *appendBatch, members []*appendRequest, notify bool) map[*appendRequest]error {
	ctx := b.ctx
	if members == nil {
		members = b.members // closed: final
	}
	results := map[*appendRequest]error{}
	fail := func(err error) map[*appendRequest]error {
		for _, m := range members {
			if errors.Is(err, errNotPgx) {
				results[m] = errNotPgx
			} else {
				results[m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
			}
		}
		return results
	}
	conn, err := s.pool.Conn(ctx)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	var inner map[*appendRequest]error
	err = conn.Raw(func(dc any) error {
		pc, ok := pgxconn.Unwrap(dc)
		if !ok {
			return errNotPgx
		}
		inner = s.appendOnConn(ctx, pc, members, notify)
		// Never hand a connection back to the pool inside a transaction.
		return pgxconn.EndSession(ctx, pc, nil)
	})
	if inner != nil && !errors.Is(err, errNotPgx) {
		// A connection that could not be cleaned up (driver.ErrBadConn)
		// is dropped by database/sql; the outcomes stand.
		return inner
	}
	if err == nil || errors.Is(err, driver.ErrBadConn) {
		err = fmt.Errorf("no outcome from the append transaction: %w", err)
	}
	return fail(err)
}

const (
	// selectHeads reads the versions of the aggregates in $1.
	selectHeads = `SELECT a.id, (SELECT COALESCE(MAX(sequence_no), 0) FROM events WHERE aggregate_id = a.id)
		FROM unnest($1::text[]) AS a(id)`
	selectStored = `SELECT id, aggregate_id, event_type, transaction_id, sequence_no, payload FROM events WHERE id = ANY($1)`
	// notifyIfWritten notifies only if the transaction inserted a row
	// (an append whose version check failed inserts none), and returns
	// the feed head after the transaction's rows (appendCoalescer.observe).
	notifyIfWritten = `SELECT (SELECT MAX(position) FROM events), pg_notify($1, '') WHERE txid_current_if_assigned() IS NOT NULL`
)

// checkedInsert is one append's INSERT that checks its version and
// numbers its rows in the database, under the append lock: it reads the
// aggregate's version and the feed head itself (it starts after the lock
// was granted, under READ COMMITTED, and after the statements of the
// appends before it in the transaction), so that no round trip is needed
// between the lock and the rows. It inserts nothing unless the version is
// the required one (required >= 0: the append's expected version, or the
// one its explicit sequence numbers imply; -1: any). The rows travel as
// arrays, so one statement (one text, prepared once per connection)
// carries an append of any size, all or nothing.
func checkedInsert(aggregateID string, required int, prepared []preparedEvent) insertStatement {
	n := len(prepared)
	ids, types, txs, payloads, metas := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]time.Time, n)
	for i, p := range prepared {
		ids[i], types[i], txs[i] = p.env.ID, p.env.EventType, p.env.TransactionID
		payloads[i], metas[i], created[i] = string(p.payload), string(p.metadata), p.env.Created
	}
	return insertStatement{sql: checkedInsertSQL, args: []any{aggregateID, required, ids, types, txs, payloads, metas, created}}
}

const checkedInsertSQL = `INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
	SELECT v.id, $1, v.event_type, cur.version + v.ord, v.transaction_id, head.position + v.ord, v.payload::jsonb, v.metadata::jsonb, v.created_at
	FROM (SELECT COALESCE(MAX(sequence_no), 0) AS version FROM events WHERE aggregate_id = $1) AS cur,
	(SELECT COALESCE(MAX(position), 0) AS position FROM events) AS head,
	unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])
		WITH ORDINALITY AS v(id, event_type, transaction_id, payload, metadata, created_at, ord)
	WHERE $2::bigint < 0 OR cur.version = $2::bigint`

// requiredVersion is the version an append needs its aggregate at: its
// expected version, or the one its explicit sequence numbers imply; -1
// when it takes any. ok is false when they disagree: no version will do.
func requiredVersion(m *appendRequest) (required int, ok bool) {
	required = m.expectedVersion
	for i, ev := range m.events {
		if ev.SequenceNo == 0 {
			continue
		}
		implied := ev.SequenceNo - i - 1
		if implied < 0 || (required >= 0 && required != implied) {
			return 0, false
		}
		required = implied
	}
	return required, true
}

// readStored reads the stored events among reqs' event IDs (see
// checkStoredIDs).
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

// explainRefusals says why appends inserted nothing (their version check
// failed in the database): the retry of an append that committed
// (domain.ErrAlreadyAppended), another event under a stored ID, or the
// version conflict with the version now stored. It runs after the
// transaction ended: stored events never change, and versions only grow.
func explainRefusals(ctx context.Context, pc *pgx.Conn, refused []*appendRequest, results map[*appendRequest]error) {
	stored := map[string]storedEvent{}
	versions := map[string]int{}
	err := readStored(ctx, pc, refused, stored)
	if err == nil {
		aggs := make([]string, 0, len(refused))
		for _, m := range refused {
			aggs = append(aggs, m.aggregateID)
		}
		var rows pgx.Rows
		if rows, err = pc.Query(ctx, selectHeads, aggs); err == nil {
			for rows.Next() {
				var agg string
				var version int
				if err = rows.Scan(&agg, &version); err != nil {
					break
				}
				versions[agg] = version
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	}
	for _, m := range refused {
		var why error
		if err != nil {
			// Maybe the retry of an append that committed: not a
			// conflict, which would have the caller run its command again.
			why = outcomeUnknown(m, err)
		} else if why = checkStoredIDs(m.aggregateID, m.expectedVersion, m.events, payloadsOf(m.prepared), stored); why == nil {
			if _, why = prepareAppend(m.aggregateID, m.expectedVersion, versions[m.aggregateID], m.events); why == nil {
				why = fmt.Errorf("%w: aggregate %q: the version check failed, nothing was stored (the aggregate is now at version %d)", domain.ErrConcurrencyConflict, m.aggregateID, versions[m.aggregateID])
			}
		}
		results[m] = why
	}
}

// appendOnConn runs the append transaction of members on pc, in one
// round trip: BEGIN, the append lock, every member's checked INSERTs, the
// NOTIFY and the COMMIT. The lock is held for the statements and the
// commit's flush only, never for a round trip to the client. Every member
// gets an outcome, however the transaction ends: an append refused before
// the batch is sent (sequence numbers no version fits) stored nothing
// either way and is explained after it (explainRefusals).
func (s *GormEventStore) appendOnConn(ctx context.Context, pc *pgx.Conn, members []*appendRequest, notify bool) map[*appendRequest]error {
	results := map[*appendRequest]error{}
	var (
		plans   []appendPlan
		refused []*appendRequest // inserted nothing: explained after the transaction
	)
	for _, m := range members {
		required, ok := requiredVersion(m)
		if !ok {
			refused = append(refused, m)
			continue
		}
		plans = append(plans, appendPlan{m, checkedInsert(m.aggregateID, required, m.prepared)})
	}
	if len(plans) > 0 {
		refused = append(refused, s.runPlans(ctx, pc, plans, notify, results)...)
	}
	if len(refused) > 0 {
		// The transaction may have ended in an error: end it before reading.
		if err := pgxconn.EndSession(ctx, pc, nil); err != nil {
			for _, m := range refused {
				results[m] = outcomeUnknown(m, err)
			}
			return results
		}
		explainRefusals(ctx, pc, refused, results)
	}
	return results
}

// outcomeUnknown is the answer for an append that stored nothing in this
// call but could not be told apart from the retry of one that committed
// (reading the stored events failed): neither a conflict (the caller
// would reload and run its command again) nor a success.
func outcomeUnknown(m *appendRequest, readErr error) error {
	return fmt.Errorf("append %d event(s) to aggregate %q: nothing was stored by this call, and whether an earlier call stored these events is unknown: retry the same call: %w",
		len(m.events), m.aggregateID, readErr)
}

// runPlans sends the transaction of plans and records the outcome of
// every plan's member in results, except the members whose version check
// failed in a transaction that committed: those it returns, for
// explainRefusals.
func (s *GormEventStore) runPlans(ctx context.Context, pc *pgx.Conn, plans []appendPlan, notify bool, results map[*appendRequest]error) (refused []*appendRequest) {
	fail := func(err error) []*appendRequest {
		for _, p := range plans {
			results[p.m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(p.m.events), p.m.aggregateID, err)
		}
		return nil
	}
	write := &pgx.Batch{}
	write.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	write.Queue("SELECT pg_advisory_xact_lock($1)", s.lockKey)
	for _, p := range plans {
		write.Queue(p.insert.sql, p.insert.args...)
	}
	if notify {
		write.Queue(notifyIfWritten, s.channel)
	}
	write.Queue("COMMIT")
	br := pc.SendBatch(ctx, write)
	defer br.Close()
	_, err := br.Exec()
	if err == nil {
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("take append lock: %w", err)
		}
	}
	if err != nil {
		return fail(err)
	}
	var (
		accepted []*appendRequest
		inserted int64
		end      *int64 // the head after the rows, when the NOTIFY said
	)
	for _, p := range plans {
		tag, err := br.Exec()
		if err != nil {
			// Not committed: the rest of the batch is skipped.
			_ = br.Close()
			s.afterRefusedInsert(ctx, pc, plans, err, notify, results)
			return nil
		}
		if tag.RowsAffected() == int64(len(p.m.events)) {
			accepted = append(accepted, p.m)
			inserted += tag.RowsAffected()
		} else {
			refused = append(refused, p.m)
		}
	}
	if notify {
		rows, err := br.Query()
		if err == nil {
			for rows.Next() {
				err = rows.Scan(&end, nil)
			}
			rows.Close()
			err = errors.Join(err, rows.Err())
		}
		if err != nil {
			if !isNotifyFailure(err) {
				// A lost connection, a cancellation: not the queue.
				return fail(fmt.Errorf("notify subscribers: %w", err))
			}
			for _, p := range plans {
				results[p.m] = notifyError{err}
			}
			return nil
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("the transaction was rolled back (%s)", tag.String())
	}
	if err != nil {
		if isNotifyFailure(err) {
			for _, p := range plans {
				results[p.m] = err
			}
			return nil
		}
		return fail(fmt.Errorf("commit: %w", err))
	}
	// COMMIT acknowledged: the outcome is decided, whatever closing the
	// batch reports (the deferred Close; the connection is then dropped).
	for _, m := range accepted {
		results[m] = nil
	}
	if end != nil && inserted > 0 {
		s.coalescer.observe(*end-inserted, *end)
	}
	return refused
}

// appendPlan is one member's statement in the append transaction.
type appendPlan struct {
	m      *appendRequest
	insert insertStatement
}

func plansMembers(plans []appendPlan) []*appendRequest {
	out := make([]*appendRequest, len(plans))
	for i, p := range plans {
		out[i] = p.m
	}
	return out
}

// afterRefusedInsert answers for a transaction whose INSERT the database
// refused (a constraint, a trigger): nothing was committed. A lone append
// gets the refusal, mapped to the domain's errors; a stored event ID is
// then told apart from the retry of an append that committed. Several
// appends are run again one by one, so that each gets its own answer.
func (s *GormEventStore) afterRefusedInsert(ctx context.Context, pc *pgx.Conn, plans []appendPlan, insertErr error, notify bool, results map[*appendRequest]error) map[*appendRequest]error {
	if len(plans) > 1 {
		for i, p := range plans {
			if err := pgxconn.EndSession(ctx, pc, nil); err != nil {
				for _, rest := range plans[i:] {
					results[rest.m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(rest.m.events), rest.m.aggregateID, err)
				}
				return results
			}
			for m, err := range s.appendOnConn(ctx, pc, []*appendRequest{p.m}, notify) {
				results[m] = err
			}
		}
		return results
	}
	m := plans[0].m
	err := s.insertError(m.aggregateID, insertErr)
	if errors.Is(err, domain.ErrInvalidEvent) {
		// An event ID is stored: stored events never change, so which
		// kind is decided after the rollback.
		rerr := pgxconn.EndSession(ctx, pc, nil)
		stored := map[string]storedEvent{}
		if rerr == nil {
			rerr = readStored(ctx, pc, []*appendRequest{m}, stored)
		}
		if rerr != nil {
			// Maybe the retry of an append that committed.
			results[m] = outcomeUnknown(m, fmt.Errorf("%v; then: %w", err, rerr))
			return results
		}
		if classified := checkStoredIDs(m.aggregateID, m.expectedVersion, m.events, payloadsOf(m.prepared), stored); classified != nil {
			err = classified
		}
	}
	if !errors.Is(err, domain.ErrInvalidEvent) && !errors.Is(err, domain.ErrConcurrencyConflict) && !errors.Is(err, domain.ErrAlreadyAppended) {
		err = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
	}
	results[m] = err
	return results
}
