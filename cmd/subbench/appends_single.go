package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/wirecount"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// Scenario 7's single-event rows (issue 31): one event per Append, as a
// request handler appends, beside a plain single-row INSERT in the same
// run, with the parts of the price measured one by one at 1 writer and
// the round trips and statements of a lone Append counted on the wire.
//
// Where a lone single-event append's time goes (issue 31, goal 1;
// measured 2026-12-03 on 2 shared CPUs, Postgres 15, fsync on, the load
// average between 1.5 and 10 from other sessions: only figures taken
// interleaved under one load are compared). pg_stat_statements is not
// loaded on the test server, so round trips and statements are counted
// on the wire (loneAppendTrips), the statements timed by hand in
// interleaved pipelines and with pgbench -r, and the server's share read
// from the backend's /proc/<pid>/schedstat.
//
//   - Round trips: 1, as the plain INSERT. Statements: 3 before (the
//     lock beside current_setting('transaction_isolation'), the checked
//     INSERT, a NOTIFY statement that also read MAX(position) again), now
//     2: the lock alone, and the checked INSERT as a CTE whose one row
//     carries the NOTIFY (pg_notify once, only when a row was inserted),
//     the feed head (RETURNING position, no second MAX probe) and the
//     isolation level (the INSERT's READ COMMITTED guard stays). No
//     BEGIN/COMMIT: the pipeline's Sync commits the implicit transaction,
//     and any error rolls it all back (afterRefusedInsert); 4 statements
//     with BEGIN ISOLATION LEVEL READ COMMITTED/COMMIT on a stricter
//     session default.
//   - The WAL flush: 45-60% of a lone append's p50 (the rows with
//     synchronous_commit off), and the append lock is held through it
//     (the lock is released after the commit record is flushed and the
//     transaction is visible, which the ordered feed needs). That is the
//     4 processes x 4 writers rows: one flush per append transaction, in
//     lock order, where the plain INSERTs' commits share flushes (group
//     commit); it is also why those rows collapse under load (a lock
//     holder descheduled stalls every process): 0.83 at load 5, 0.27 at
//     load 10, same binary.
//   - Over the plain INSERT, by hand (median of rounds' p50 ratios, the
//     plain INSERT = 1.00, ~310 µs at load 2-3): the lock as a second
//     statement +0.03; the checked INSERT instead of the plain one +0.10
//     (two index probes, the aggregate's version on
//     events_aggregate_sequence_key and the feed head on
//     events_position_key, INSERT ... SELECT, and idx_events_transaction_id,
//     which plain_events lacks; pgbench -r: 311 µs vs 243 µs for the
//     plain INSERT, each its own round trip). Of that, the index is +4 µs
//     of 193 (partIndexed, a quiet machine), the probes +24; the
//     probes as VALUES with scalar subqueries instead of INSERT ...
//     SELECT were no faster (pgbench, alternating rounds); the NOTIFY +0.04-0.06 as a
//     statement of its own, +0.03-0.04 folded into the INSERT's (what is
//     left is its commit: Postgres 15 takes a database-wide lock in
//     PreCommit_Notify, held through the flush, and signals every
//     listening backend of the database, other channels' too). The
//     three statements of before: 1.20 and 1.24 in two runs, the two of
//     now 1.17 in both (the NOTIFY's own statement about 0.01 of that,
//     the isolation level moved from the lock's statement to the
//     INSERT's row the rest).
//   - The client side (the stores' Append beside their statements by
//     hand): +0.03 to +0.08, the same syscalls per call as the plain
//     INSERT (1 write, 2 reads, strace -c), the rest validation, JSON,
//     the pool.
//   - Planning under the lock (pg_prepared_statements): the INSERT of a
//     shared transaction (several appends) and of one append of several
//     events take their rows as arrays, whose lengths the custom plans
//     are costed from, so the plan cache never chose the generic plan
//     and planned the INSERT again on every execution (generic_plans 0,
//     custom_plans every one): about 0.3 ms of planning (EXPLAIN
//     SUMMARY; 0.03 ms on the generic plan), after the lock was granted,
//     so under it, in every coalesced transaction. The lock statement of
//     such a transaction now sets plan_cache_mode = force_generic_plan
//     for the transaction (set_config LOCAL). 4 processes x 4 writers of
//     pgxstore Append, 6 alternating rounds of 4 s: 4,590 -> 6,150
//     appends/s in all (medians), the new one ahead in every round (a
//     second series: 4,760 -> 6,500, 6 of 6 again). The rows of this
//     scenario did not show it in the one pair run after the change (4
//     processes x 4 writers 0.80/0.72 after, 0.85/0.85 before; 16
//     writers 1.42/1.55 after, 1.52/1.49 before, load 1.6-2.7), within
//     their round-to-round spread. A lone single-event append was
//     already on its generic plan.
//   - The store's Append, before and after, alternating processes of 5 s
//     (8 pairs): p50 ratio to a plain INSERT 1.277 -> 1.267 (pgx), 1.276
//     -> 1.270 (GORM), within the noise; the server backend's CPU per
//     append (synchronous_commit off, 12 pairs) 1.74 -> 1.68 times the
//     plain INSERT's (about 5 µs less). So the fold is worth a few per
//     cent at 1 writer; the rest of the gap to 0.9 is the checked INSERT,
//     the lock's statement and the NOTIFY's commit, which the guarantees
//     need (one lock, one NOTIFY per committed transaction, the version
//     checked in the database).

// singleSize is the single-event rows' share of the mode's sizes. The
// machine's load moves a commit's WAL flush, most of a lone append's
// latency, by a factor of several from one second to the next, so the
// variants are compared in many short rounds, one writer's in blocks of
// tens of milliseconds (interleaved).
type singleSize struct {
	writers []int
	// rounds of roundTime per variant: at 1 writer the variants
	// interleaved in short blocks; at more, each variant's writers for
	// roundTime in turn.
	rounds    int
	roundTime time.Duration
	// procRounds of procTime per variant, from several processes.
	procRounds int
	procTime   time.Duration
}

func singleSizes(b *bench) singleSize {
	sz := b.sizes()
	if b.cfg.Quick {
		return singleSize{writers: []int{1, 16}, rounds: 2, roundTime: sz.appendDuration, procRounds: 1, procTime: sz.appendDuration}
	}
	return singleSize{writers: []int{1, 16}, rounds: 9, roundTime: time.Second, procRounds: 5, procTime: time.Second}
}

// The keys of the single-event variants (singleVariants).
const (
	singleGorm    = "single-gorm"
	singlePgx     = "single-pgx"
	singleAsync   = "single-async"
	singlePlain   = "single-plain"
	singleLock    = "single-lock"
	singleIndexed = "single-indexed"
	singleChecked = "single-checked"
	singleHand    = "single-hand"
	singleHand3   = "single-hand3"
)

const plainSingleName = "a plain single-row INSERT per call (its own implicit transaction, one statement, one round trip, pgx on the GORM pool), position from a sequence: no lock, no version check, no NOTIFY, no ordering guarantee"

// singleVariants are the variants of one event per call: the stores'
// Append (expected version 0, a new aggregate each call: the version
// check runs), the plain single-row INSERT, and the parts of the
// library's price (singlePart). lockKey is a lock of the plain table's
// own, storeKey the stores' append lock.
func singleVariants(lockKey, storeKey int64) []appendVariant {
	store := func(pick func(appendTarget) domain.EventStore) func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
		return func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			s := pick(t)
			return func(ctx context.Context, w, k int) error {
				if s == nil {
					return errors.New("no event store of this variant here")
				}
				return s.Append(ctx, fmt.Sprintf("%s-%d-a%d", tag, w, k), 0, makeEvents(1, k)...)
			}
		}
	}
	part := func(p singlePart) func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
		return func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			return func(ctx context.Context, w, k int) error {
				return singleByHand(ctx, t.db, p, lockKey, storeKey, fmt.Sprintf("%s-%d-a%d", tag, w, k), makeEvents(1, k)[0])
			}
		}
	}
	return []appendVariant{
		{key: singleGorm, label: "GormEventStore.Append", perCall: 1, appendOne: store(func(t appendTarget) domain.EventStore { return t.gorm })},
		{key: singlePgx, label: "pgxstore.EventStore.Append", perCall: 1, appendOne: store(func(t appendTarget) domain.EventStore { return t.pgx })},
		{key: singleAsync, label: "pgxstore.EventStore.Append, synchronous_commit off", perCall: 1, appendOne: store(func(t appendTarget) domain.EventStore { return t.async })},
		{key: singlePlain, label: "plain single-row INSERT", perCall: 1, appendOne: func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			return func(ctx context.Context, w, k int) error {
				return plainAppend(ctx, t.db, fmt.Sprintf("%s-%d-a%d", tag, w, k), makeEvents(1, k), 0, false)
			}
		}},
		{key: singleLock, label: "[advisory lock, plain INSERT]", perCall: 1, appendOne: part(partLock)},
		{key: singleIndexed, label: "[advisory lock, plain INSERT with the events table's indexes]", perCall: 1, appendOne: part(partIndexed)},
		{key: singleChecked, label: "[append lock, checked INSERT]", perCall: 1, appendOne: part(partChecked)},
		{key: singleHand, label: "[append lock, checked INSERT, NOTIFY]", perCall: 1, appendOne: part(partNotify)},
		{key: singleHand3, label: "[append lock and isolation level, checked INSERT, NOTIFY statement]", perCall: 1, appendOne: part(partThree)},
	}
}

// singlePart is one step from the plain INSERT to the library's lone
// append, each pipelined in one round trip in the implicit transaction
// the pipeline's Sync ends, as the library sends it.
type singlePart int

const (
	// partLock: pg_advisory_xact_lock (a lock of the plain table's own),
	// then the plain INSERT.
	partLock singlePart = iota
	// partIndexed: partLock into plain_events_indexed, which has the
	// events table's index on transaction_id too: what the schema's
	// indexes cost, apart from the checked INSERT's probes.
	partIndexed
	// partChecked: the stores' append lock, then the library's checked
	// single-row INSERT into events: the version check and the position
	// read under the append lock.
	partChecked
	// partNotify: the stores' append lock, then partChecked's INSERT with
	// the NOTIFY in one statement, as the library writes: the library's
	// statements, without its client side.
	partNotify
	// partThree: the library's three statements before the NOTIFY moved
	// into the INSERT's (issue 31): the append lock beside the isolation
	// level, the checked INSERT, the NOTIFY in a statement of its own
	// (handNotify3), which also read the feed head; beside partNotify, the
	// price of the third statement under the same load.
	partThree
)

// The library's statements for one event (infrastructure/pgevents),
// reproduced for the parts, as previousAppend reproduces the design
// before issue 19.
const (
	handLock   = `SELECT pg_advisory_xact_lock($1)`
	handInsert = `INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
	SELECT $3, $1, $4, cur.version + 1, $5, head.position + 1, $6::text::jsonb, $7::text::jsonb, $8
	FROM (SELECT COALESCE(MAX(sequence_no), 0) AS version FROM events WHERE aggregate_id = $1) AS cur,
	(SELECT COALESCE(MAX(position), 0) AS position FROM events) AS head
	WHERE ($2::bigint < 0 OR cur.version = $2::bigint) AND current_setting('transaction_isolation') = 'read committed'`
	// handLock3 and handNotify3 are partThree's lock and NOTIFY.
	handLock3   = `SELECT current_setting('transaction_isolation'), pg_advisory_xact_lock($1)`
	handNotify3 = `SELECT (SELECT MAX(position) FROM events), pg_notify($1, '') WHERE txid_current_if_assigned() IS NOT NULL`
	// handWrite is handInsert with the NOTIFY, the library's statement
	// that writes.
	handWrite = `WITH written AS (` + handInsert + `
	RETURNING aggregate_id, position)
	SELECT COUNT(*), MAX(position), current_setting('transaction_isolation'),
		CASE WHEN $9::boolean AND COUNT(*) > 0 THEN pg_notify($10, '') END
	FROM written`
)

// singleByHand appends the event e to aggregate as part p says, on one
// connection of db's pool, in one round trip.
func singleByHand(ctx context.Context, db *gorm.DB, p singlePart, lockKey, storeKey int64, aggregate string, e domain.EventEnvelope[any]) error {
	payload, metadata, err := eventJSON(e)
	if err != nil {
		return err
	}
	created := e.Created.UTC().Truncate(time.Microsecond)
	return onPgxConn(ctx, db, func(c *pgx.Conn) error {
		b := &pgx.Batch{}
		if p == partLock || p == partIndexed {
			table := "plain_events"
			if p == partIndexed {
				table = "plain_events_indexed"
			}
			b.Queue("SELECT pg_advisory_xact_lock($1)", lockKey)
			b.Queue(`INSERT INTO `+table+` (id, aggregate_id, event_type, sequence_no, transaction_id, payload, metadata, created_at) VALUES ($1, $2, $3, 1, $4, $5::jsonb, $6::jsonb, $7)`,
				e.ID, aggregate, e.EventType, e.TransactionID, string(payload), string(metadata), created)
			return c.SendBatch(ctx, b).Close()
		}
		if p == partThree {
			b.Queue(handLock3, storeKey)
		} else {
			b.Queue(handLock, storeKey)
		}
		var inserted int64
		if p == partNotify {
			b.Queue(handWrite, aggregate, 0, e.ID, e.EventType, e.TransactionID, string(payload), string(metadata), created, true, infrastructure.PostgresNotifyChannel).
				QueryRow(func(row pgx.Row) error { return row.Scan(&inserted, nil, nil, nil) })
		} else {
			b.Queue(handInsert, aggregate, 0, e.ID, e.EventType, e.TransactionID, string(payload), string(metadata), created).Exec(func(tag pgconn.CommandTag) error {
				inserted = tag.RowsAffected()
				return nil
			})
		}
		if p == partThree {
			b.Queue(handNotify3, infrastructure.PostgresNotifyChannel)
		}
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if inserted != 1 {
			return fmt.Errorf("by hand: aggregate %q: the checked INSERT inserted %d rows", aggregate, inserted)
		}
		return nil
	})
}

// singleResult is one variant's rounds: each round's rate and p50.
type singleResult struct {
	rates, p50s []float64
	all         []time.Duration
}

func (r *singleResult) add(res appendResult) {
	lat := sortedCopy(res.latencies)
	r.rates = append(r.rates, res.rate())
	r.p50s = append(r.p50s, percentile(lat, 50))
	r.all = append(r.all, res.latencies...)
}

// ratios are the rounds' figure/baseline ratios, of rates or of p50s.
func ratios(fig, base []float64) []float64 {
	out := make([]float64, 0, len(fig))
	for i := range min(len(fig), len(base)) {
		out = append(out, fig[i]/base[i])
	}
	return out
}

// medianRow is a row of medians over rounds: figure and baseline the
// medians of the rounds' figures, ratio the median of the rounds' own
// ratios (variants alternate within a round, so a round's ratio is
// measured under one load).
func medianRow(name string, fig, base []float64, unit, baseName string) Row {
	r := newRow(name, median(fig), median(base), unit, baseName)
	if rs := ratios(fig, base); len(rs) > 0 {
		v := median(rs)
		r.Ratio = &v
	}
	return r
}

// roundList formats the rounds' ratios.
func roundList(fig, base []float64) string {
	var s []string
	for _, r := range ratios(fig, base) {
		s = append(s, fmt.Sprintf("%.2f", r))
	}
	return strings.Join(s, "/")
}

// runSingleAppends: the single-event rows of scenario 7.
func runSingleAppends(ctx context.Context, b *bench, dsn string, lockKey, storeKey int64) ([]Row, error) {
	rows, err := loneAppendTrips(ctx, b, dsn)
	if err != nil {
		return rows, err
	}
	for _, writers := range singleSizes(b).writers {
		r, err := singleWriters(ctx, b, dsn, writers, lockKey, storeKey)
		rows = append(rows, r...)
		if err != nil {
			return rows, err
		}
	}
	mp, err := singleProcesses(ctx, b, dsn, lockKey, storeKey)
	return append(rows, mp...), err
}

// singleWriters measures the single-event variants with writers
// goroutines of one process: the stores and the plain INSERT, and at 1
// writer the parts, in rotating order, each round alternating its order.
func singleWriters(ctx context.Context, b *bench, dsn string, writers int, lockKey, storeKey int64) ([]Row, error) {
	ss := singleSizes(b)
	defer b.casePools()()
	var t appendTarget
	var err error
	// The pools' batches: the stores' append transactions (the plain
	// INSERT is none), to tell how many appends share one.
	gormWire, pgxWire := &wirecount.Counter{}, &wirecount.Counter{}
	if t.db, err = b.openPG(dsn, writers+1, gormWire); err != nil {
		return nil, err
	}
	if t.gorm, err = infrastructure.NewGormEventStore(t.db); err != nil {
		return nil, err
	}
	pgxDB, err := pgxBackend.open(ctx, b, dsn, "", writers+1, pgxWire)
	if err != nil {
		return nil, err
	}
	t.pgx = pgxDB.store
	transactions := map[string]*wirecount.Counter{singleGorm: gormWire, singlePgx: pgxWire}
	calls, txs := map[string]int64{}, map[string]int64{}
	keys := []string{singleGorm, singlePgx, singlePlain}
	if writers == 1 {
		if t.async, err = asyncPgxStore(ctx, b, dsn, writers+1); err != nil {
			return nil, err
		}
		keys = append(keys, singleLock, singleIndexed, singleChecked, singleHand, singleHand3, singleAsync)
	}
	variants := map[string]appendVariant{}
	for _, v := range singleVariants(lockKey, storeKey) {
		variants[v.key] = v
	}
	res := map[string]*singleResult{}
	for _, key := range keys {
		res[key] = &singleResult{}
	}
	how := fmt.Sprintf("%d rounds of %s per variant, in rotating order, reversed every other round", ss.rounds, ss.roundTime)
	if writers == 1 {
		how = fmt.Sprintf("%d rounds of %s per variant, the variants interleaved in blocks of %d calls (one block of each in turn, rotating)", ss.rounds, ss.roundTime, interleaveBlock)
	}
	for round := range ss.rounds {
		if writers == 1 {
			if err := interleaved(ctx, t, ss.roundTime, round, keys, variants, res); err != nil {
				return nil, err
			}
			continue
		}
		order := slices.Clone(keys)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for i := range order {
			key := order[(i+round/2)%len(order)]
			v := variants[key]
			var b0 int64
			if w := transactions[key]; w != nil {
				b0 = w.Batches()
			}
			r, err := timedWriters(ctx, writers, ss.roundTime, v.events(), v.appendOne(t, fmt.Sprintf("%s-w%d-r%d", key, writers, round)), nil)
			if err != nil {
				return nil, fmt.Errorf("%d writers, one event per call, %s: %w", writers, v.label, err)
			}
			res[key].add(r)
			if w := transactions[key]; w != nil {
				calls[key] += r.events + 2*int64(writers) // and the untimed warm-up
				txs[key] += w.Batches() - b0
			}
		}
	}
	name := fmt.Sprintf("%d writer(s), one event per call", writers)
	gorm, px, plain := res[singleGorm], res[singlePgx], res[singlePlain]
	note := fmt.Sprintf("%s: %s; figures are the rounds' medians, ratios the medians of the rounds' ratios (rate ratios per round, GORM %s, pgx %s; p50 ratios per round, GORM %s, pgx %s); p50/p99 over all rounds: GORM %.3f/%.3f ms, pgx %.3f/%.3f ms, plain %.3f/%.3f ms",
		name, how, roundList(gorm.rates, plain.rates), roundList(px.rates, plain.rates), roundList(gorm.p50s, plain.p50s), roundList(px.p50s, plain.p50s),
		pct(gorm.all, 50), pct(gorm.all, 99), pct(px.all, 50), pct(px.all, 99), pct(plain.all, 50), pct(plain.all, 99))
	if writers > 1 {
		perTx := func(key string) float64 { return float64(calls[key]) / float64(max(txs[key], 1)) }
		note += fmt.Sprintf("; appends per append transaction (the coalescing; each transaction holds the append lock through its WAL flush, where the plain INSERTs' commits share flushes): GORM %.1f, pgx %.1f", perTx(singleGorm), perTx(singlePgx))
	}
	gr := medianRow(name+": GormEventStore.Append", gorm.rates, plain.rates, "ev/s", plainSingleName).note(note)
	pr := medianRow(pgxBackend.label(name+": pgxstore.EventStore.Append"), px.rates, plain.rates, "ev/s", plainSingleName)
	gl := medianRow(name+": GormEventStore.Append p50", gorm.p50s, plain.p50s, "ms", "p50 of the plain single-row INSERT, same rounds")
	pl := medianRow(pgxBackend.label(name+": pgxstore.EventStore.Append p50"), px.p50s, plain.p50s, "ms", "p50 of the plain single-row INSERT, same rounds")
	gr, pr = rateGoal(gr, 0.9), rateGoal(pr, 0.9)
	if writers == 1 {
		gl, pl = p50Goal(gl, 1.2), p50Goal(pl, 1.2)
	}
	rows := []Row{gr, pr, gl, pl}
	if writers == 1 {
		rows = append(rows, singleParts(name, res)...)
	}
	return rows, nil
}

// interleaved is one round of one writer: the variants of keys in
// short blocks of calls (interleaveBlock), one block of each in an order
// rotating by one each time, for roundTime per variant, so that every
// variant meets the same load while its connection stays as warm as one
// writer keeps it; each variant's rate is its calls over the time they
// took.
func interleaved(ctx context.Context, t appendTarget, roundTime time.Duration, round int, keys []string, variants map[string]appendVariant, res map[string]*singleResult) error {
	calls := make([]func(ctx context.Context, w, k int) error, len(keys))
	for i, key := range keys {
		calls[i] = variants[key].appendOne(t, fmt.Sprintf("%s-w1-r%d", key, round))
	}
	lats := make([][]time.Duration, len(keys))
	k := 0
	for ; k < 2; k++ { // warm: connections open, statements prepared
		for i := range calls {
			if err := calls[i](ctx, 0, k); err != nil {
				return fmt.Errorf("1 writer, one event per call, %s: %w", variants[keys[i]].label, err)
			}
		}
	}
	deadline := time.Now().Add(roundTime * time.Duration(len(keys)))
	for block := 0; time.Now().Before(deadline); block++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		for j := range calls {
			i := (j + block) % len(calls)
			for range interleaveBlock {
				t0 := time.Now()
				if err := calls[i](ctx, 0, k); err != nil {
					return fmt.Errorf("1 writer, one event per call, %s: %w", variants[keys[i]].label, err)
				}
				lats[i] = append(lats[i], time.Since(t0))
				k++
			}
		}
	}
	for i, key := range keys {
		var sum time.Duration
		for _, l := range lats[i] {
			sum += l
		}
		res[key].add(appendResult{events: int64(len(lats[i])), elapsed: sum, latencies: lats[i]})
	}
	return nil
}

// interleaveBlock is the calls of one variant in a row in interleaved:
// some tens of milliseconds.
const interleaveBlock = 50

// rateGoal attaches the goal ratio >= least.
func rateGoal(r Row, least float64) Row {
	return r.goal(fmt.Sprintf(">= %.1f", least), r.Ratio != nil && *r.Ratio >= least)
}

// p50Goal attaches the goal ratio <= most.
func p50Goal(r Row, most float64) Row {
	return r.goal(fmt.Sprintf("<= %.1f", most), r.Ratio != nil && *r.Ratio <= most)
}

// pct is the p-th percentile of d in ms.
func pct(d []time.Duration, p float64) float64 { return percentile(sortedCopy(d), p) }

// singleParts are the 1-writer rows of the parts: each step's p50 beside
// the plain INSERT's, and a note of where the time goes.
func singleParts(name string, res map[string]*singleResult) []Row {
	plain := res[singlePlain]
	p50 := func(key string) float64 { return median(res[key].p50s) }
	us := func(a, b string) float64 { return (p50(a) - p50(b)) * 1000 }
	where := fmt.Sprintf("where a lone single-event append's time goes (medians of the rounds' p50s, in µs over the step before): plain INSERT %.0f µs; + advisory lock (a second statement in the pipeline) %+.0f; + the events table's index on transaction_id (the same plain INSERT into a table with it) %+.0f; + version check and position read under the append lock (the checked INSERT into events instead) %+.0f; + NOTIFY %+.0f (in the INSERT's statement: the library's statements by hand); + the client side: GORM %+.0f, pgx %+.0f (GormEventStore/pgxstore Append beside its own statements); the WAL flush the append lock is held through: pgx %.0f µs (its Append minus the same Append on sessions with synchronous_commit off)",
		p50(singlePlain)*1000, us(singleLock, singlePlain), us(singleIndexed, singleLock), us(singleChecked, singleIndexed), us(singleHand, singleChecked),
		us(singleGorm, singleHand), us(singlePgx, singleHand), us(singlePgx, singleAsync))
	var rows []Row
	for _, p := range []struct{ key, label string }{
		{singleLock, "[advisory lock, plain INSERT]"},
		{singleIndexed, "[advisory lock, plain INSERT with the events table's indexes]"},
		{singleChecked, "[append lock, checked INSERT]"},
		{singleHand, "[append lock, checked INSERT, NOTIFY] (the library's statements by hand)"},
		{singleAsync, "pgxstore Append, synchronous_commit off"},
	} {
		r := medianRow(fmt.Sprintf("%s, parts: %s p50", name, p.label), res[p.key].p50s, plain.p50s, "ms", "p50 of the plain single-row INSERT, same rounds")
		rows = append(rows, r.note(where))
	}
	three := "the library's three statements before issue 31 moved the NOTIFY into the INSERT's statement, by hand, same rounds"
	rows = append(rows,
		medianRow(name+", parts: the library's 2 statements vs its 3 before", res[singleHand].rates, res[singleHand3].rates, "ev/s", three).
			note("the library's 2 statements vs its 3 before: [the append lock, the checked INSERT with the NOTIFY] against [the append lock beside the isolation level, the checked INSERT, the NOTIFY with the feed head], interleaved in the same rounds: what the fold saves under the run's load"),
		medianRow(name+", parts: the library's 2 statements vs its 3 before p50", res[singleHand].p50s, res[singleHand3].p50s, "ms", three))
	return rows
}

// asyncPgxStore is pgxstore's store on a pool of its own whose sessions
// commit without waiting for the WAL flush (synchronous_commit off), to
// tell the flush's share of an append's latency.
func asyncPgxStore(ctx context.Context, b *bench, dsn string, maxConns int) (domain.EventStore, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pgx pool: %w", err)
	}
	b.pools = append(b.pools, func() error { pool.Close(); return nil })
	return pgxstore.NewEventStore(ctx, pool)
}

// singleProcesses measures the stores and the plain INSERT, one event per
// call, from sz.appendProcs processes of sz.appendProcWriters writers.
func singleProcesses(ctx context.Context, b *bench, dsn string, lockKey, storeKey int64) ([]Row, error) {
	sz, ss := b.sizes(), singleSizes(b)
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable for child processes: %w", err)
	}
	keys := []string{singleGorm, singlePgx, singlePlain}
	res := map[string]*singleResult{}
	for round := range ss.procRounds {
		for i := range keys {
			key := keys[(i+round)%len(keys)]
			r, err := appendProcessRound(ctx, exe, sz.appendProcs, appendChildConfig{
				DSN: dsn, Variant: key, Writers: sz.appendProcWriters, Duration: ss.procTime,
				Tag: fmt.Sprintf("mp-%s-r%d", key, round), LockKey: lockKey, PreviousKey: storeKey,
			})
			if err != nil {
				return nil, fmt.Errorf("%d processes x %d writers, %s: %w", sz.appendProcs, sz.appendProcWriters, key, err)
			}
			if res[key] == nil {
				res[key] = &singleResult{}
			}
			res[key].add(r)
		}
	}
	name := fmt.Sprintf("%d processes x %d writers, one event per call", sz.appendProcs, sz.appendProcWriters)
	gorm, px, plain := res[singleGorm], res[singlePgx], res[singlePlain]
	note := fmt.Sprintf("%s: separate processes, each with one pool of %d connections of the variant's backend, started together after warming up; %d rounds in rotating order, medians (rate ratios per round, GORM %s, pgx %s); p50 medians: GORM %.3f ms, pgx %.3f ms, plain %.3f ms",
		name, sz.appendProcWriters+1, ss.procRounds, roundList(gorm.rates, plain.rates), roundList(px.rates, plain.rates), median(gorm.p50s), median(px.p50s), median(plain.p50s))
	return []Row{
		rateGoal(medianRow(name+": GormEventStore.Append", gorm.rates, plain.rates, "ev/s", plainSingleName+", from the same processes"), 0.8).note(note),
		rateGoal(medianRow(pgxBackend.label(name+": pgxstore.EventStore.Append"), px.rates, plain.rates, "ev/s", plainSingleName+", from the same processes"), 0.8),
	}, nil
}

// loneAppendTrips counts, on the wire, the round trips and statements of
// a lone single-event Append of each store (its connection warm, its
// statements prepared) and of the plain INSERT, on pools of one
// connection of their own.
func loneAppendTrips(ctx context.Context, b *bench, dsn string) ([]Row, error) {
	defer b.casePools()()
	w := &wirecount.Counter{}
	ccfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	ccfg.DialFunc, ccfg.Tracer = w.Dial(ccfg.DialFunc), w
	sqlDB := stdlib.OpenDB(*ccfg)
	sqlDB.SetMaxOpenConns(1)
	b.pools = append(b.pools, sqlDB.Close)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, err
	}
	gs, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 1
	pcfg.ConnConfig.DialFunc, pcfg.ConnConfig.Tracer = w.Dial(pcfg.ConnConfig.DialFunc), w
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	b.pools = append(b.pools, func() error { pool.Close(); return nil })
	ps, err := pgxstore.NewEventStore(ctx, pool)
	if err != nil {
		return nil, err
	}
	type counted struct{ turns, stmts int64 }
	measure := func(name string, appendOne func(k int) error) (counted, error) {
		for k := range 3 { // open the connection, prepare the statements
			if err := appendOne(k); err != nil {
				return counted{}, fmt.Errorf("%s: %w", name, err)
			}
		}
		t, s, err := w.Count(func() error { return appendOne(3) })
		if err != nil {
			return counted{}, fmt.Errorf("%s: %w", name, err)
		}
		return counted{t, s}, nil
	}
	storeAppend := func(s domain.EventStore, tag string) func(k int) error {
		return func(k int) error {
			return s.Append(ctx, fmt.Sprintf("%s-%d", tag, k), 0, makeEvents(1, k)...)
		}
	}
	plain, err := measure("plain", func(k int) error {
		return plainAppend(ctx, db, fmt.Sprintf("rt-plain-%d", k), makeEvents(1, k), 0, false)
	})
	if err != nil {
		return nil, err
	}
	g, err := measure("GORM", storeAppend(gs, "rt-gorm"))
	if err != nil {
		return nil, err
	}
	p, err := measure("pgx", storeAppend(ps, "rt-pgx"))
	if err != nil {
		return nil, err
	}
	note := fmt.Sprintf("lone single-event Append, counted on the wire (a write after a read starts a round trip; statements: each query and each query of a pipeline, pgx's tracer) on a pool of one warm connection: GORM %d round trip(s), %d statements; pgx %d round trip(s), %d statements; plain INSERT %d, %d (before issue 31 both stores sent 1 round trip of 5 statements: BEGIN, the lock, the checked INSERT, the NOTIFY, COMMIT; then 3, without BEGIN and COMMIT; now 2, the NOTIFY in the INSERT's statement)",
		g.turns, g.stmts, p.turns, p.stmts, plain.turns, plain.stmts)
	bname := "the plain single-row INSERT's, counted the same way"
	return []Row{
		newRow("lone single-event Append: round trips", float64(g.turns), float64(plain.turns), "count", bname).goal("1", g.turns == 1).note(note),
		newRow(pgxBackend.label("lone single-event Append: round trips"), float64(p.turns), float64(plain.turns), "count", bname).goal("1", p.turns == 1),
		newRow("lone single-event Append: statements", float64(g.stmts), float64(plain.stmts), "count", bname),
		newRow(pgxBackend.label("lone single-event Append: statements"), float64(p.stmts), float64(plain.stmts), "count", bname),
	}, nil
}
