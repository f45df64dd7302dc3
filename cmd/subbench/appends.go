package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/coalesce"
)

const eventsPerAppend = 10

// appendResult is one timed run of concurrent writers.
type appendResult struct {
	events    int64
	elapsed   time.Duration
	latencies []time.Duration
}

func (r appendResult) rate() float64 { return float64(r.events) / r.elapsed.Seconds() }

// runAppends: scenario 7.
func runAppends(ctx context.Context, b *bench) ([]Row, error) {
	sz := b.sizes()
	dsn, setup, _, err := b.newPGStore(ctx, "appends", 2)
	if err != nil {
		return nil, err
	}
	// The same columns as events, positions from a sequence, no lock.
	if err := setup.Exec(`CREATE TABLE plain_events (
		id             text        NOT NULL PRIMARY KEY,
		aggregate_id   text        NOT NULL,
		event_type     text        NOT NULL,
		sequence_no    bigint      NOT NULL,
		transaction_id text        NOT NULL DEFAULT '',
		position       bigserial   NOT NULL,
		payload        jsonb,
		metadata       jsonb,
		created_at     timestamptz NOT NULL,
		CONSTRAINT plain_events_aggregate_sequence_key UNIQUE (aggregate_id, sequence_no),
		CONSTRAINT plain_events_position_key UNIQUE (position)
	)`).Error; err != nil {
		return nil, err
	}
	// plain_events with the events table's one index more (on
	// transaction_id, the original's schema): the single-event parts'
	// step between the plain INSERT and the checked one (partIndexed).
	for _, ddl := range []string{`CREATE TABLE plain_events_indexed (LIKE plain_events INCLUDING ALL)`, `CREATE INDEX ON plain_events_indexed (transaction_id)`} {
		if err := setup.Exec(ddl).Error; err != nil {
			return nil, err
		}
	}
	h := fnv.New64a()
	h.Write([]byte(b.runID + " plain append lock"))
	lockKey := int64(h.Sum64() | 1)
	previousKey, err := appendLockKey(ctx, setup)
	if err != nil {
		return nil, err
	}
	variants := tenEventVariants(lockKey, previousKey)
	var rows []Row
	for _, writers := range sz.appendWriters {
		r, err := appendWriters(ctx, b, dsn, writers, variants)
		rows = append(rows, r...)
		if err != nil {
			return rows, err
		}
	}
	mp, err := runAppendProcesses(ctx, b, dsn, lockKey, previousKey)
	rows = append(rows, mp...)
	if err != nil {
		return rows, err
	}
	single, err := runSingleAppends(ctx, b, dsn, lockKey, previousKey)
	return append(rows, single...), err
}

// appendWriters measures every variant with writers goroutines of one
// process, on pools of writers+1 connections (a GORM one, and a pgx one
// for pgxstore's store) closed when it returns.
func appendWriters(ctx context.Context, b *bench, dsn string, writers int, variants []appendVariant) ([]Row, error) {
	sz := b.sizes()
	defer b.casePools()()
	var (
		rows []Row
		t    appendTarget
		err  error
	)
	if t.db, err = b.openPG(dsn, writers+1, nil); err != nil {
		return rows, err
	}
	if t.gorm, err = infrastructure.NewGormEventStore(t.db); err != nil {
		return rows, err
	}
	pgxDB, err := pgxBackend.open(ctx, b, dsn, "", writers+1, nil)
	if err != nil {
		return rows, err
	}
	t.pgx = pgxDB.store
	results := map[string]*appendResult{}
	for round := range sz.appendRounds {
		for i := range variants {
			v := variants[(i+round)%len(variants)]
			if round%2 == 1 {
				v = variants[len(variants)-1-i]
			}
			coalesce.Disabled.Store(v.key == "uncoalesced")
			res, err := timedWriters(ctx, writers, sz.appendDuration, v.events(), v.appendOne(t, fmt.Sprintf("%s-w%d-r%d", v.key, writers, round)), nil)
			coalesce.Disabled.Store(false)
			if err != nil {
				return rows, fmt.Errorf("%d writers, %s: %w", writers, v.label, err)
			}
			if results[v.key] == nil {
				results[v.key] = &appendResult{}
			}
			results[v.key].events += res.events
			results[v.key].elapsed += res.elapsed
			results[v.key].latencies = append(results[v.key].latencies, res.latencies...)
		}
	}
	lib, plain, prev, unco, px := results["library"], results["plain"], results["previous"], results["uncoalesced"], results["pgx"]
	ll, bl, pl, ul, xl := sortedCopy(lib.latencies), sortedCopy(plain.latencies), sortedCopy(prev.latencies), sortedCopy(unco.latencies), sortedCopy(px.latencies)
	note := fmt.Sprintf("%d events per append, %d rounds of %s per variant, variants alternating; append latency p50/p99: library %.2f/%.2f ms, library uncoalesced %.2f/%.2f ms, previous design %.2f/%.2f ms, plain %.2f/%.2f ms, pgx %.2f/%.2f ms; library %.0f appends/s, pgx %.0f appends/s",
		eventsPerAppend, sz.appendRounds, sz.appendDuration, percentile(ll, 50), percentile(ll, 99), percentile(ul, 50), percentile(ul, 99),
		percentile(pl, 50), percentile(pl, 99), percentile(bl, 50), percentile(bl, 99), percentile(xl, 50), percentile(xl, 99),
		lib.rate()/eventsPerAppend, px.rate()/eventsPerAppend)
	row := newRow(fmt.Sprintf("%d writer(s): GormEventStore.Append", writers), lib.rate(), plain.rate(), "ev/s", plainAppendName).note(fmt.Sprintf("%d writer(s): %s", writers, note))
	pxRow := newRow(pgxBackend.label(fmt.Sprintf("%d writer(s): pgxstore.EventStore.Append", writers)), px.rate(), plain.rate(), "ev/s", plainAppendName).
		note("pgx: pgxstore.EventStore.Append on a pgx pool of its own of the same size, same table and lock")
	if writers == 16 {
		row = row.goal(">= 0.8", lib.rate() >= 0.8*plain.rate())
		pxRow = pxRow.goal(">= 0.8", px.rate() >= 0.8*plain.rate())
	}
	rows = append(rows, row, pxRow,
		newRow(pgxBackend.label(fmt.Sprintf("%d writer(s): pgx vs GORM", writers)), px.rate(), lib.rate(), "ev/s", "GormEventStore.Append, same run, variants alternating"))
	rows = append(rows, newRow(fmt.Sprintf("%d writer(s): library, coalescing off", writers), unco.rate(), plain.rate(), "ev/s", plainAppendName).
		note("library, coalescing off: GormEventStore.Append with internal/coalesce.Disabled, every Append its own transaction"))
	rows = append(rows, newRow(fmt.Sprintf("%d writer(s): previous design", writers), prev.rate(), plain.rate(), "ev/s", plainAppendName).
		note("previous design: the store's append before issue 19 reproduced statement for statement by subbench (previousAppend), same table and lock"))
	if writers == 1 {
		rows = append(rows, newRow("1 writer: append latency p50, library vs previous design", percentile(ll, 50), percentile(pl, 50), "ms",
			"p50 append latency of the previous design, same run").goal("<= 1.2", percentile(ll, 50) <= 1.2*percentile(pl, 50)),
			newRow(pgxBackend.label("1 writer: append latency p50, pgx vs GORM"), percentile(xl, 50), percentile(ll, 50), "ms",
				"p50 append latency of GormEventStore.Append, same run"))
	}
	for _, key := range []string{"lock", "notify"} {
		v := results[key]
		vl := sortedCopy(v.latencies)
		label := map[string]string{"lock": "plain + advisory lock only", "notify": "plain + pg_notify only"}[key]
		how := map[string]string{"lock": "pipelined [BEGIN, pg_advisory_xact_lock] then [INSERT, COMMIT], the store's lock pattern", "notify": "pipelined [BEGIN, INSERT, pg_notify, COMMIT]"}[key]
		rows = append(rows, newRow(fmt.Sprintf("%d writer(s): %s", writers, label), v.rate(), plain.rate(), "ev/s", plainAppendName).
			note(fmt.Sprintf("%s (decomposition of the price): append latency p50/p99 %.2f/%.2f ms", how, percentile(vl, 50), percentile(vl, 99))))
	}
	return rows, nil
}

const plainAppendName = "the same rows in one multi-row INSERT statement per append (its own transaction, one round trip, pgx on the same pool), positions from a sequence: no lock, no version check, no NOTIFY, no ordering guarantee"

// appendTarget is what the variants of scenario 7 append through.
type appendTarget struct {
	db   *gorm.DB          // the GORM pool: GormEventStore, hand-written appends
	gorm domain.EventStore // GormEventStore on db
	pgx  domain.EventStore // pgxstore.EventStore on a pgx pool; nil in a child process but single-pgx's
	// async is pgxstore.EventStore on a pool whose sessions commit
	// without waiting for the WAL flush (single-async); nil elsewhere.
	async domain.EventStore
}

// appendVariant is one way of appending measured by scenario 7.
type appendVariant struct {
	key, label string
	appendOne  func(t appendTarget, tag string) func(ctx context.Context, w, k int) error
	// perCall is the number of events one call appends; 0 means
	// eventsPerAppend.
	perCall int
}

// events is the number of events one call of the variant appends.
func (v appendVariant) events() int {
	if v.perCall == 0 {
		return eventsPerAppend
	}
	return v.perCall
}

// appendVariants: the library, the library with coalescing off (the
// caller sets coalesce.Disabled), the pgx backend's store, the previous
// design (previousAppend, under the store's lock previousKey), the plain
// baseline and the baseline plus each of the library's costs (lockKey: a
// lock of its own); then the single-event variants (singleVariants).
func appendVariants(lockKey, previousKey int64) []appendVariant {
	return append(tenEventVariants(lockKey, previousKey), singleVariants(lockKey, previousKey)...)
}

// tenEventVariants are the variants of eventsPerAppend events per call.
func tenEventVariants(lockKey, previousKey int64) []appendVariant {
	storeAppend := func(pick func(appendTarget) domain.EventStore) func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
		return func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			store := pick(t)
			return func(ctx context.Context, w, k int) error {
				if store == nil {
					return errors.New("no event store of this variant here")
				}
				return store.Append(ctx, fmt.Sprintf("%s-%d-a%d", tag, w, k), -1, makeEvents(eventsPerAppend, k)...)
			}
		}
	}
	library := storeAppend(func(t appendTarget) domain.EventStore { return t.gorm })
	// pgx next to library: the rounds alternate their order (A B ... then
	// ... B A), so the two backends' stores run back to back.
	return []appendVariant{
		{key: "library", label: "GormEventStore.Append", appendOne: library},
		{key: "pgx", label: "pgxstore.EventStore.Append", appendOne: storeAppend(func(t appendTarget) domain.EventStore { return t.pgx })},
		{key: "uncoalesced", label: "GormEventStore.Append, coalescing off", appendOne: library},
		{key: "previous", label: "previous design", appendOne: func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			return func(ctx context.Context, w, k int) error {
				return previousAppend(ctx, t.db, previousKey, fmt.Sprintf("%s-%d-a%d", tag, w, k), makeEvents(eventsPerAppend, k))
			}
		}},
		{key: "plain", label: "plain multi-row INSERT", appendOne: func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			return func(ctx context.Context, w, k int) error {
				return plainAppend(ctx, t.db, fmt.Sprintf("%s-%d-a%d", tag, w, k), makeEvents(eventsPerAppend, k), 0, false)
			}
		}},
		{key: "lock", label: "plain INSERT + pg_advisory_xact_lock", appendOne: func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			return func(ctx context.Context, w, k int) error {
				return plainAppend(ctx, t.db, fmt.Sprintf("%s-%d-a%d", tag, w, k), makeEvents(eventsPerAppend, k), lockKey, false)
			}
		}},
		{key: "notify", label: "plain INSERT + pg_notify", appendOne: func(t appendTarget, tag string) func(ctx context.Context, w, k int) error {
			return func(ctx context.Context, w, k int) error {
				return plainAppend(ctx, t.db, fmt.Sprintf("%s-%d-a%d", tag, w, k), makeEvents(eventsPerAppend, k), 0, true)
			}
		}},
	}
}

// timedWriters runs writers goroutines calling appendOne back to back for
// d and counts the events appended, perCall a call. Each writer first appends twice
// untimed, so that the pool's connections are open and their statements
// prepared before the clock starts.
//
// beforeStart, when set, runs once every writer is warm, just before the
// clock starts (a child process reports ready and waits for the go).
func timedWriters(ctx context.Context, writers int, d time.Duration, perCall int, appendOne func(ctx context.Context, w, k int) error, beforeStart func() error) (appendResult, error) {
	var (
		mu     sync.Mutex
		res    appendResult
		wg     sync.WaitGroup
		warmed sync.WaitGroup
	)
	const warmup = 2
	errs := make([]error, writers)
	startc := make(chan time.Time)
	warmed.Add(writers)
	for w := range writers {
		wg.Go(func() {
			for k := range warmup {
				if err := appendOne(ctx, w, k); err != nil {
					errs[w] = err
					break
				}
			}
			warmed.Done()
			start, ok := <-startc
			if !ok || errs[w] != nil {
				return
			}
			deadline := start.Add(d)
			var lats []time.Duration
			for k := warmup; time.Now().Before(deadline) && ctx.Err() == nil; k++ {
				t0 := time.Now()
				if err := appendOne(ctx, w, k); err != nil {
					errs[w] = err
					break
				}
				lats = append(lats, time.Since(t0))
			}
			mu.Lock()
			res.events += int64(len(lats) * perCall)
			res.latencies = append(res.latencies, lats...)
			mu.Unlock()
		})
	}
	warmed.Wait()
	if beforeStart != nil {
		if err := beforeStart(); err != nil {
			close(startc)
			wg.Wait()
			return res, err
		}
	}
	start := time.Now()
	for range writers {
		startc <- start
	}
	close(startc)
	wg.Wait()
	res.elapsed = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	return res, ctx.Err()
}

// plainAppend inserts the events' rows without the store: positions come
// from the column's sequence, so they become visible in commit order rather
// than position order (no ordering guarantee), and there is no version
// check. Like the store's Postgres append it talks to pgx directly and
// pipelines its statements (pgx batches), so that the comparison is of
// the work, not of the client stack or the number of round trips:
//
//   - plain (lockKey 0, !notify): one multi-row INSERT, in its own implicit
//     transaction: one round trip, the cheapest atomic append there is;
//   - lockKey != 0: [BEGIN; pg_advisory_xact_lock] then [INSERT; COMMIT]:
//     two round trips with the lock held across the second and the commit,
//     as the store holds its append lock;
//   - notify: [BEGIN; INSERT; pg_notify; COMMIT] in one round trip.
func plainAppend(ctx context.Context, db *gorm.DB, aggregate string, events []domain.EventEnvelope[any], lockKey int64, notify bool) error {
	rows := make([][]any, len(events))
	for i, e := range events {
		payload, metadata, err := eventJSON(e)
		if err != nil {
			return err
		}
		rows[i] = []any{e.ID, aggregate, e.EventType, i + 1, e.TransactionID, payload, metadata, e.Created.UTC().Truncate(time.Microsecond)}
	}
	sql, args := insertValues("INSERT INTO plain_events (id, aggregate_id, event_type, sequence_no, transaction_id, payload, metadata, created_at) VALUES ", rows)
	return onPgxConn(ctx, db, func(c *pgx.Conn) error {
		run := func(b *pgx.Batch) error {
			return c.SendBatch(ctx, b).Close()
		}
		switch {
		case lockKey == 0 && !notify:
			_, err := c.Exec(ctx, sql, args...)
			return err
		case lockKey != 0:
			first := &pgx.Batch{}
			first.Queue("BEGIN")
			first.Queue("SELECT pg_advisory_xact_lock($1)", lockKey)
			second := &pgx.Batch{}
			second.Queue(sql, args...)
			second.Queue("COMMIT")
			if err := run(first); err != nil {
				return err
			}
			return run(second)
		default:
			b := &pgx.Batch{}
			b.Queue("BEGIN")
			b.Queue(sql, args...)
			b.Queue("SELECT pg_notify($1, '')", infrastructure.PostgresNotifyChannel)
			b.Queue("COMMIT")
			return run(b)
		}
	})
}

// onPgxConn runs fn on one connection of db's pool as a *pgx.Conn (the
// benchmark's hand-written appends pipeline statements, as the store
// does). A transaction fn leaves open (it failed mid-way) is rolled back,
// so that the connection goes back to the pool idle.
func onPgxConn(ctx context.Context, db *gorm.DB, fn func(c *pgx.Conn) error) error {
	pool, err := db.DB()
	if err != nil {
		return err
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return errors.New("not a pgx connection")
		}
		c := pc.Conn()
		defer func() {
			if c.PgConn().TxStatus() != 'I' {
				_, _ = c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			}
		}()
		return fn(c)
	})
}

// jsonb is an INSERT value that insertValues casts to jsonb.
type jsonb string

// eventJSON is e's payload and metadata as the events table stores them.
func eventJSON(e domain.EventEnvelope[any]) (payload, metadata jsonb, err error) {
	p, err := json.Marshal(e.Payload)
	if err != nil {
		return "", "", err
	}
	m, err := json.Marshal(e.Metadata)
	if err != nil {
		return "", "", err
	}
	return jsonb(p), jsonb(m), nil
}

// insertValues is head followed by one tuple of numbered placeholders per
// row ("($1, $2::jsonb, ...)", a jsonb value cast), and the rows' values
// in placeholder order: a multi-row INSERT for pgx.
func insertValues(head string, rows [][]any) (string, []any) {
	var sql strings.Builder
	sql.WriteString(head)
	var args []any
	for i, row := range rows {
		if i > 0 {
			sql.WriteString(", ")
		}
		sql.WriteString("(")
		for j, v := range row {
			if j > 0 {
				sql.WriteString(", ")
			}
			args = append(args, v)
			fmt.Fprintf(&sql, "$%d", len(args))
			if s, ok := v.(jsonb); ok {
				sql.WriteString("::jsonb")
				args[len(args)-1] = string(s)
			}
		}
		sql.WriteString(")")
	}
	return sql.String(), args
}
