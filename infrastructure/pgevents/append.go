package pgevents

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// EventsTableQuery resolves the events table that a connection's
// search_path names to its schema-qualified name (NULL when there is
// none), for AppendLockKey.
const EventsTableQuery = `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE c.oid = to_regclass('events')`

// AppendLockKey is the key of the transaction-scoped advisory lock that
// every append to the events table named qualified (EventsTableQuery)
// takes before its rows take positions, whichever store makes it: the
// ordered feed's soundness rests on every appender taking this one lock.
func AppendLockKey(qualified string) int64 { return schema.LockKey("append", qualified) }

// ConnFunc runs f on a pgx connection that is outside any transaction,
// and returns nil once f has returned; an error only when it could not
// run f (no connection could be had), which then becomes every waiting
// append's outcome. f leaves the connection outside any transaction, or
// closed. A store passes its own: a connection of its pgx pool, or the
// pgx connection under a database/sql one.
type ConnFunc func(ctx context.Context, f func(pc *pgx.Conn)) error

// Appender is the engine of the Postgres append: it runs appends to the
// events table as the pipelined transaction both of the module's Postgres
// stores run (the append lock, one checked INSERT for all the appends it
// carries and the NOTIFY, in one round trip, committed by the pipeline's
// Sync: see runPlans), and coalesces the appends of one store that wait
// for the lock at the same time into one transaction, each keeping its
// own version check and outcome. It exists so that infrastructure.GormEventStore and
// pgxstore.EventStore number rows, notify, refuse and answer retries
// alike on one table, under one lock; a backend of one's own may use it
// too.
//
// An Appender is safe for concurrent use; use one per store (its
// coalescing and its in-flight limit are the store's).
type Appender struct {
	table     Table
	channel   string
	conn      ConnFunc
	coalescer appendCoalescer
	// explicit is set once a session ran an append transaction sent
	// without BEGIN at another level than READ COMMITTED (its default):
	// from then on every transaction sets its level (see runPlans).
	explicit atomic.Bool
}

// NewAppender returns an Appender that appends to table, under its
// append lock (Table.LockKey), NOTIFYs channel after every committed
// append (checked by the caller: CheckChannel) and runs its transactions
// on connections from conn.
func NewAppender(table Table, channel string, conn ConnFunc) *Appender {
	return &Appender{table: table, channel: channel, conn: conn}
}

// SetCoalescing turns the coalescing of concurrent appends on (the
// default) or off, every append then its own transaction, for tests and
// benchmarks that compare the two. Call it before the first Append.
func (a *Appender) SetCoalescing(on bool) { a.coalescer.solo = !on }

// Waiting is the number of appends waiting in batches that form behind
// the transactions in flight (0 when none waits).
func (a *Appender) Waiting() int {
	a.coalescer.mu.Lock()
	defer a.coalescer.mu.Unlock()
	n := 0
	for _, b := range a.coalescer.forming {
		n += len(b.members)
	}
	return n
}

// InFlightLimit is the number of append transactions the Appender keeps
// in flight at present: two while its transactions follow one another in
// the feed, one once another appender's rows came between two of them.
func (a *Appender) InFlightLimit() int {
	a.coalescer.mu.Lock()
	defer a.coalescer.mu.Unlock()
	return a.coalescer.limit()
}

// Append stores events for one aggregate atomically, as
// domain.EventStore.Append says, through the coalescer: alone when the
// store's appends are not queued for the lock, in a shared transaction
// otherwise. prepared is what PrepareAppend returned for the call's
// events with an unknown version (-1); events must not be empty (a store
// answers an empty append's version check itself). The batch reads
// prepared and a copy of the envelopes without their payloads and
// metadata, never the caller's values, which the caller owns again once
// Append returns, even when it gave up on an append that may still
// commit. The error is unwrapped: the domain's errors as they are, others
// naming the append.
func (a *Appender) Append(ctx context.Context, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], prepared []Prepared) error {
	own := make([]domain.EventEnvelope[any], len(events))
	for i, ev := range events {
		ev.Payload, ev.Metadata = nil, nil
		own[i] = ev
	}
	return a.coalescer.run(&appendRequest{ctx: ctx, aggregateID: aggregateID, expectedVersion: expectedVersion, events: own, prepared: prepared}, a.runBatch)
}

// runBatch is one append transaction for a batch of appends, delivering
// each member's outcome. When a full notification queue refuses the
// NOTIFY, the batch runs again without it: notifications are wake-ups,
// subscribers poll anyway, and a failed notify never fails an append.
func (a *Appender) runBatch(b *appendBatch) {
	defer b.cancel()
	results := a.appendBatchOnce(b, nil, true)
	var retry []*appendRequest
	for m, err := range results {
		if IsNotifyFailure(err) {
			retry = append(retry, m)
		}
	}
	if len(retry) > 0 {
		for m, err := range a.appendBatchOnce(b, retry, false) {
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
// (the NOTIFY-less retry). It returns every member's outcome, and leaves
// the connection outside any transaction, or closed (endSession).
//
// The transaction is one network round trip, pipelined with pgx, however
// many appends share it (appendOnConn). The INSERT checks each append's
// version and numbers its rows in the database (checkedInsert,
// mergedInsert), in a statement that starts after the lock was granted,
// under READ COMMITTED, so it sees every earlier append. An append whose
// check fails inserts nothing and is told why after the commit
// (explainRefusals).
//
// Commit latency is what a subscriber's wake-up waits for, and the lock is
// held through it, which is why the append is worth the pipelining.
func (a *Appender) appendBatchOnce(b *appendBatch, members []*appendRequest, notify bool) map[*appendRequest]error {
	ctx := b.ctx
	if members == nil {
		members = b.members // closed: final
	}
	var results map[*appendRequest]error
	err := a.conn(ctx, func(pc *pgx.Conn) {
		results = a.appendOnConn(ctx, pc, members, notify)
		// Never hand a connection back to the pool inside a transaction.
		_ = endSession(ctx, pc)
	})
	if results != nil {
		// The outcomes stand, whatever handing the connection back said.
		return results
	}
	if err == nil {
		err = errors.New("no outcome from the append transaction")
	}
	results = map[*appendRequest]error{}
	for _, m := range members {
		results[m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
	}
	return results
}

// endSession rolls back whatever transaction the session still has open,
// so that the connection goes back to its pool clean; a connection that
// cannot be rolled back is closed (its pool then drops it). The rollback
// runs even when ctx is cancelled, with its own deadline.
func endSession(ctx context.Context, pc *pgx.Conn) error {
	if pc.IsClosed() || pc.PgConn().TxStatus() == 'I' {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := pc.Exec(rctx, "ROLLBACK"); err != nil {
		_ = pc.Close(rctx)
		return err
	}
	return nil
}

const (
	// selectHeadsTemplate reads the versions of the aggregates in $1.
	selectHeadsTemplate = `SELECT a.id, (SELECT COALESCE(MAX(sequence_no), 0) FROM {{events}} WHERE aggregate_id = a.id)
		FROM unnest($1::text[]) AS a(id)`
	// takeLock takes the append lock, in a statement of its own: the
	// write after it (writeOne, writeMerged) starts after the lock was
	// granted, so that under READ COMMITTED its snapshot holds every
	// append committed before.
	takeLock = `SELECT pg_advisory_xact_lock($1)`
	// takeLockGeneric is takeLock for a transaction whose INSERT takes
	// its rows as arrays (several appends, writeMerged, or one append of
	// several events, writeMany): it also has the transaction plan its
	// statements generically (plan_cache_mode, set_config LOCAL: the
	// session's own setting is back at the commit). Such an INSERT's
	// custom plans are estimated from its arrays' lengths, so Postgres's
	// plan cache never picks the generic plan by itself and plans the
	// INSERT again on every execution (about 0.3 ms for a merged one,
	// against 0.03 ms for the cached generic plan), after the lock was
	// granted: under the lock, before the flush. plan_cache_mode exists
	// from Postgres 12 on.
	takeLockGeneric = `SELECT pg_advisory_xact_lock($1),
		CASE WHEN current_setting('server_version_num')::int >= 120000 THEN set_config('plan_cache_mode', 'force_generic_plan', true) END`
	// readCommitted is the guard every checked INSERT ends with: under
	// another isolation level (a session whose default is stricter, in a
	// transaction sent without BEGIN) it inserts nothing, and the
	// Appender begins its transactions explicitly from then on (see
	// runPlans).
	readCommitted = `current_setting('transaction_isolation') = 'read committed'`
)

// checkedInsert is one append's INSERT that checks its version and
// numbers its rows in the database, under the append lock: it reads the
// aggregate's version and the feed head itself (it starts after the lock
// was granted, under READ COMMITTED, and after the statements of the
// appends before it in the transaction), so that no round trip is needed
// between the lock and the rows. It inserts nothing unless the version is
// the required one (required >= 0: the append's expected version, or the
// one its explicit sequence numbers imply; -1: any). An append of one
// event, what a request handler appends, is one row of plain parameters
// (checkedInsertOneTemplate, the cheapest for the server to run); a larger one
// travels as arrays, so that one statement (one text, prepared once per
// connection) carries an append of any size, all or nothing.
func checkedInsert(q *tableSQL, aggregateID string, required int, prepared []Prepared) insertStatement {
	if len(prepared) == 1 {
		p := prepared[0]
		return insertStatement{sql: q.checkedInsertOne, write: q.writeOne, args: []any{aggregateID, required, p.Envelope.ID, p.Envelope.EventType,
			p.Envelope.TransactionID, string(p.Payload), string(p.Metadata), p.Envelope.Created}}
	}
	n := len(prepared)
	ids, types, txs, payloads, metas := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]time.Time, n)
	for i, p := range prepared {
		ids[i], types[i], txs[i] = p.Envelope.ID, p.Envelope.EventType, p.Envelope.TransactionID
		payloads[i], metas[i], created[i] = string(p.Payload), string(p.Metadata), p.Envelope.Created
	}
	return insertStatement{sql: q.checkedInsert, write: q.writeMany, args: []any{aggregateID, required, ids, types, txs, payloads, metas, created}, arrays: true}
}

// insertStatement is one checked INSERT (sql) and its arguments; write
// is the same INSERT as the append transaction's statement that writes
// (writeTemplate), which takes two arguments more: whether to notify, and
// the channel. merged marks the INSERT of several appends (mergedInsert),
// whose write returns the aggregate of every row it inserted; arrays
// marks an INSERT whose rows travel as arrays (several events), which the
// transaction plans generically (takeLockGeneric).
type insertStatement struct {
	sql, write     string
	args           []any
	merged, arrays bool
}

const checkedInsertTemplate = `INSERT INTO {{events}} (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
	SELECT v.id, $1, v.event_type, cur.version + v.ord, v.transaction_id, head.position + v.ord, v.payload::jsonb, v.metadata::jsonb, v.created_at
	FROM (SELECT COALESCE(MAX(sequence_no), 0) AS version FROM {{events}} WHERE aggregate_id = $1) AS cur,
	(SELECT COALESCE(MAX(position), 0) AS position FROM {{events}}) AS head,
	unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])
		WITH ORDINALITY AS v(id, event_type, transaction_id, payload, metadata, created_at, ord)
	WHERE ($2::bigint < 0 OR cur.version = $2::bigint) AND ` + readCommitted

// checkedInsertOneTemplate is checkedInsertTemplate for one event, its values
// plain parameters.
const checkedInsertOneTemplate = `INSERT INTO {{events}} (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
	SELECT $3, $1, $4, cur.version + 1, $5, head.position + 1, $6::text::jsonb, $7::text::jsonb, $8
	FROM (SELECT COALESCE(MAX(sequence_no), 0) AS version FROM {{events}} WHERE aggregate_id = $1) AS cur,
	(SELECT COALESCE(MAX(position), 0) AS position FROM {{events}}) AS head
	WHERE ($2::bigint < 0 OR cur.version = $2::bigint) AND ` + readCommitted

// writeTemplate is the statement of an append transaction that writes:
// its checked INSERT (checkedInsertTemplate, checkedInsertOneTemplate or
// mergedInsertTemplate, whose last parameter is $last) as a CTE, and,
// when $last+1 is true and the INSERT inserted a row, the NOTIFY on
// channel $last+2, so that the NOTIFY costs no statement of its own. Its
// one row says what the INSERT did (inserted: the rows it inserted, or,
// merged, the aggregate of every row), the feed head after the
// transaction's rows (NULL when none: appendCoalescer.observe) and the
// transaction's isolation level, which the INSERT's guard checked
// (readCommitted). The aggregate makes the NOTIFY run once, however many
// rows there are (Postgres would fold repeats anyway: one channel, one
// payload, one transaction).
func writeTemplate(insert string, last int, inserted string) string {
	return `WITH written AS (` + insert + `
	RETURNING aggregate_id, position)
	SELECT ` + inserted + `, MAX(position), current_setting('transaction_isolation'),
		CASE WHEN $` + strconv.Itoa(last+1) + `::boolean AND COUNT(*) > 0 THEN pg_notify($` + strconv.Itoa(last+2) + `, '') END
	FROM written`
}

// The statements that write (writeTemplate): a lone append's, one
// event's or several's, and a shared transaction's.
var (
	writeOneTemplate    = writeTemplate(checkedInsertOneTemplate, 8, "COUNT(*)")
	writeManyTemplate   = writeTemplate(checkedInsertTemplate, 8, "COUNT(*)")
	writeMergedTemplate = writeTemplate(mergedInsertTemplate, 9, "array_agg(aggregate_id)")
)

// mergedInsert is the one INSERT of a transaction's several appends:
// each row carries its append's aggregate, required version and place
// among the append's events, each append's version is checked against
// its aggregate's, and the rows of the appends that pass take the
// positions after the feed head in arrival order, each append's
// contiguous. An append's rows are inserted all or none (the check is
// per aggregate, and a batch takes no two appends to one aggregate).
func mergedInsert(q *tableSQL, plans []appendPlan) insertStatement {
	n := 0
	for _, p := range plans {
		n += len(p.m.prepared)
	}
	aggs, ids, types, txs, payloads, metas := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	required, ks := make([]int64, 0, n), make([]int64, 0, n)
	created := make([]time.Time, 0, n)
	for _, p := range plans {
		for i, e := range p.m.prepared {
			aggs, required, ks = append(aggs, p.m.aggregateID), append(required, int64(p.required)), append(ks, int64(i+1))
			ids, types, txs = append(ids, e.Envelope.ID), append(types, e.Envelope.EventType), append(txs, e.Envelope.TransactionID)
			payloads, metas, created = append(payloads, string(e.Payload)), append(metas, string(e.Metadata)), append(created, e.Envelope.Created)
		}
	}
	return insertStatement{sql: q.mergedInsert, write: q.writeMerged, args: []any{aggs, required, ks, ids, types, txs, payloads, metas, created}, merged: true, arrays: true}
}

const mergedInsertTemplate = `INSERT INTO {{events}} (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
	SELECT v.id, v.agg, v.event_type, cur.version + v.k, v.transaction_id, head.position + row_number() OVER (ORDER BY v.ord),
		v.payload::jsonb, v.metadata::jsonb, v.created_at
	FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::timestamptz[])
		WITH ORDINALITY AS v(agg, required, k, id, event_type, transaction_id, payload, metadata, created_at, ord)
	CROSS JOIN LATERAL (SELECT COALESCE(MAX(sequence_no), 0) AS version FROM {{events}} WHERE aggregate_id = v.agg) AS cur
	CROSS JOIN (SELECT COALESCE(MAX(position), 0) AS position FROM {{events}}) AS head
	WHERE (v.required < 0 OR cur.version = v.required) AND ` + readCommitted

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
// CheckStoredIDs).
func readStored(ctx context.Context, pc *pgx.Conn, q *tableSQL, reqs []*appendRequest, into map[string]Stored) error {
	var ids []string
	for _, m := range reqs {
		for _, ev := range m.events {
			ids = append(ids, ev.ID)
		}
	}
	rows, err := pc.Query(ctx, q.selectStored, ids)
	if err != nil {
		return fmt.Errorf("read stored event IDs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Stored
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
func explainRefusals(ctx context.Context, pc *pgx.Conn, q *tableSQL, refused []*appendRequest, results map[*appendRequest]error) {
	stored := map[string]Stored{}
	versions := map[string]int{}
	err := readStored(ctx, pc, q, refused, stored)
	if err == nil {
		aggs := make([]string, 0, len(refused))
		for _, m := range refused {
			aggs = append(aggs, m.aggregateID)
		}
		var rows pgx.Rows
		if rows, err = pc.Query(ctx, q.selectHeads, aggs); err == nil {
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
		} else if why = CheckStoredIDs(m.aggregateID, m.expectedVersion, m.events, m.prepared, stored); why == nil {
			if _, why = PrepareAppend(m.aggregateID, m.expectedVersion, versions[m.aggregateID], m.events); why == nil {
				why = fmt.Errorf("%w: aggregate %q: the version check failed, nothing was stored (the aggregate is now at version %d)", domain.ErrConcurrencyConflict, m.aggregateID, versions[m.aggregateID])
			}
		}
		results[m] = why
	}
}

// appendOnConn runs the append transaction of members on pc, in one
// round trip: the append lock, the members' checked INSERT and the NOTIFY
// (runPlans). The lock is held for the statements and the
// commit's flush only, never for a round trip to the client. Every member
// gets an outcome, however the transaction ends: an append refused before
// the batch is sent (sequence numbers no version fits) stored nothing
// either way and is explained after it (explainRefusals).
func (a *Appender) appendOnConn(ctx context.Context, pc *pgx.Conn, members []*appendRequest, notify bool) map[*appendRequest]error {
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
		plans = append(plans, appendPlan{m: m, required: required})
	}
	if len(plans) > 0 {
		refused = append(refused, a.runPlans(ctx, pc, plans, notify, results)...)
	}
	if len(refused) > 0 {
		// The transaction may have ended in an error: end it before reading.
		if err := endSession(ctx, pc); err != nil {
			for _, m := range refused {
				results[m] = outcomeUnknown(m, err)
			}
			return results
		}
		explainRefusals(ctx, pc, a.table.sql, refused, results)
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
//
// The transaction is two statements, pipelined in one round trip, in the
// implicit transaction that the pipeline's Sync commits, whatever the
// number of appends: the append lock (takeLock), then one statement that
// writes (writeTemplate): the INSERT for all the plans (checkedInsert
// for one, mergedInsert for several), the NOTIFY when it inserted a row,
// the feed head after its rows and the transaction's isolation level.
// The INSERT checks that the transaction runs at READ COMMITTED (the
// session's default level applies without BEGIN): when it does not,
// nothing was inserted, and the transaction runs again, as every later
// one of the Appender does, between BEGIN ISOLATION LEVEL READ COMMITTED
// and COMMIT (explicit).
func (a *Appender) runPlans(ctx context.Context, pc *pgx.Conn, plans []appendPlan, notify bool, results map[*appendRequest]error) (refused []*appendRequest) {
	fail := func(err error) []*appendRequest {
		for _, p := range plans {
			results[p.m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(p.m.events), p.m.aggregateID, err)
		}
		return nil
	}
	var insert insertStatement
	if len(plans) == 1 {
		insert = checkedInsert(a.table.sql, plans[0].m.aggregateID, plans[0].required, plans[0].m.prepared)
	} else {
		insert = mergedInsert(a.table.sql, plans)
	}
	explicit := a.explicit.Load()
	write := &pgx.Batch{}
	if explicit {
		write.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	}
	if insert.arrays {
		write.Queue(takeLockGeneric, a.table.LockKey())
	} else {
		write.Queue(takeLock, a.table.LockKey())
	}
	write.Queue(insert.write, append(insert.args, notify, a.channel)...)
	if explicit {
		write.Queue("COMMIT")
	}
	br := pc.SendBatch(ctx, write)
	defer br.Close()
	var err error
	if explicit {
		_, err = br.Exec()
	}
	if err == nil {
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("take append lock: %w", err)
		}
	}
	if err != nil {
		return fail(err)
	}
	w, err := readWritten(br, insert, plans)
	if err != nil {
		// Not committed: the rest of the batch is skipped.
		_ = br.Close()
		if notify && IsNotifyFailure(err) {
			for _, p := range plans {
				results[p.m] = NotifyError{err}
			}
			return nil
		}
		a.afterRefusedInsert(ctx, pc, plans, err, notify, results)
		return nil
	}
	if w.level != "read committed" {
		// The INSERT's guard stored nothing: run it again in a
		// transaction that sets its level.
		if err := br.Close(); err != nil {
			return fail(err)
		}
		a.explicit.Store(true)
		return a.runPlans(ctx, pc, plans, notify, results)
	}
	var (
		accepted []*appendRequest
		rows     int64
	)
	for _, p := range plans {
		if n := w.inserted[p.m.aggregateID]; n == int64(len(p.m.events)) {
			accepted = append(accepted, p.m)
			rows += n
		} else {
			refused = append(refused, p.m)
		}
	}
	// The commit: COMMIT's tag, or without BEGIN the pipeline's Sync,
	// which answers the implicit transaction's commit.
	if explicit {
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("the transaction was rolled back (%s)", tag.String())
		}
	} else {
		err = br.Close()
	}
	if err != nil {
		if IsNotifyFailure(err) {
			for _, p := range plans {
				results[p.m] = err
			}
			return nil
		}
		return fail(fmt.Errorf("commit: %w", err))
	}
	// Commit acknowledged: the outcome is decided, whatever closing the
	// batch reports (the deferred Close; the connection is then dropped).
	for _, m := range accepted {
		results[m] = nil
	}
	if w.end != nil && rows > 0 {
		a.coalescer.observe(*w.end-rows, *w.end)
	}
	return refused
}

// written is what the statement that writes (writeTemplate) answered:
// the rows inserted per aggregate, the feed head after them (nil when
// none) and the transaction's isolation level.
type written struct {
	inserted map[string]int64
	end      *int64
	level    string
}

// readWritten reads the answer of the transaction's statement that
// writes, for plans.
func readWritten(br pgx.BatchResults, insert insertStatement, plans []appendPlan) (written, error) {
	w := written{inserted: make(map[string]int64, len(plans))}
	if !insert.merged {
		var n int64
		if err := br.QueryRow().Scan(&n, &w.end, &w.level, nil); err != nil {
			return written{}, err
		}
		w.inserted[plans[0].m.aggregateID] = n
		return w, nil
	}
	var aggs []string
	if err := br.QueryRow().Scan(&aggs, &w.end, &w.level, nil); err != nil {
		return written{}, err
	}
	for _, agg := range aggs {
		w.inserted[agg]++
	}
	return w, nil
}

// appendPlan is one member of the append transaction and the version
// its INSERT requires (requiredVersion).
type appendPlan struct {
	m        *appendRequest
	required int
}

// afterRefusedInsert answers for a transaction whose INSERT the database
// refused (a constraint, a trigger): nothing was committed. A lone append
// gets the refusal, mapped to the domain's errors; a stored event ID is
// then told apart from the retry of an append that committed. Several
// appends are run again one by one, so that each gets its own answer.
func (a *Appender) afterRefusedInsert(ctx context.Context, pc *pgx.Conn, plans []appendPlan, insertErr error, notify bool, results map[*appendRequest]error) {
	if len(plans) > 1 {
		for i, p := range plans {
			if err := endSession(ctx, pc); err != nil || pc.IsClosed() {
				if err == nil {
					err = errors.New("the connection was closed")
				}
				for _, rest := range plans[i:] {
					results[rest.m] = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(rest.m.events), rest.m.aggregateID, err)
				}
				return
			}
			for m, err := range a.appendOnConn(ctx, pc, []*appendRequest{p.m}, notify) {
				results[m] = err
			}
		}
		return
	}
	m := plans[0].m
	err := InsertError(m.aggregateID, insertErr)
	if errors.Is(err, domain.ErrInvalidEvent) {
		// An event ID is stored: stored events never change, so which
		// kind is decided after the rollback.
		rerr := endSession(ctx, pc)
		stored := map[string]Stored{}
		if rerr == nil {
			rerr = readStored(ctx, pc, a.table.sql, []*appendRequest{m}, stored)
		}
		if rerr != nil {
			// Maybe the retry of an append that committed.
			results[m] = outcomeUnknown(m, fmt.Errorf("%v; then: %w", err, rerr))
			return
		}
		if classified := CheckStoredIDs(m.aggregateID, m.expectedVersion, m.events, m.prepared, stored); classified != nil {
			err = classified
		}
	}
	if !definite(err) {
		err = fmt.Errorf("append %d event(s) to aggregate %q: %w", len(m.events), m.aggregateID, err)
	}
	results[m] = err
}

// NotifyError marks the failure of an append's NOTIFY statement itself
// (IsNotifyFailure): a store that runs the NOTIFY outside an Appender
// wraps the statement's error in it, to run the append again without it.
type NotifyError struct{ Err error }

func (e NotifyError) Error() string { return "notify subscribers: " + e.Err.Error() }

// Unwrap returns the statement's error.
func (e NotifyError) Unwrap() error { return e.Err }

// IsNotifyFailure reports an error caused by an append's NOTIFY: a
// NotifyError, or Postgres refusing the NOTIFY or the COMMIT that
// delivers it because the server's notification queue is full
// (program_limit_exceeded about notifications, SQLSTATE 54000). Such an
// append is run again without the NOTIFY: notifications are wake-ups,
// subscribers poll anyway. It is safe for concurrent use.
func IsNotifyFailure(err error) bool {
	if err == nil {
		return false
	}
	if errors.As(err, new(NotifyError)) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "54000" && strings.Contains(pgErr.Message, "notif")
}

// InsertError maps a Postgres unique violation of an append's INSERT to
// the domain's errors: an event ID already stored (events_pkey) to
// domain.ErrInvalidEvent, any other (a sequence number or a position
// taken) to domain.ErrConcurrencyConflict; any other error is wrapped as
// the INSERT's failure. It is safe for concurrent use.
func InsertError(aggregateID string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return fmt.Errorf("insert events: %w", err)
	}
	switch {
	case pgErr.ConstraintName == "events_pkey":
		return fmt.Errorf("%w: aggregate %q: an event ID is already stored: %s", domain.ErrInvalidEvent, aggregateID, pgErr.Detail)
	case pgErr.Detail != "":
		return fmt.Errorf("%w: aggregate %q: %s", domain.ErrConcurrencyConflict, aggregateID, pgErr.Detail)
	}
	return fmt.Errorf("%w: aggregate %q: UNIQUE constraint failed: %s", domain.ErrConcurrencyConflict, aggregateID, pgErr.ConstraintName)
}
