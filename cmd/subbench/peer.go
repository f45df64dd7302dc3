package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// Scenario 13 runs a peer beside the library: watermill-sql
// (github.com/ThreeDotsLabs/watermill-sql/v4), the Postgres queue schema
// (PostgreSQLQueueSchema and its offsets adapter), through pgx's
// database/sql driver, consumed in its transactional handler mode (the
// handler writes through the subscriber's transaction, TxFromContext, and
// the ack commits both). Each side works on a schema of its own; in every
// round both run each measure, the side that goes first alternating, and
// the rows are the rounds' medians, the library's as the figure and the
// peer's as the baseline.

// peerSizes are scenario 13's sizes.
type peerSizes struct {
	rounds         int
	appendDuration time.Duration
	appendWriters  []int
	// events is the backlog of a catch-up, by one consumer and by four.
	events                  int
	wakeAppends, wakeWarmup int
	wakeSpacing             time.Duration
	idleWindow              time.Duration
}

func (b *bench) peerSizes() peerSizes {
	if b.cfg.Quick {
		return peerSizes{
			rounds: 2, appendDuration: 100 * time.Millisecond, appendWriters: []int{1, 16},
			events:      500,
			wakeAppends: 10, wakeWarmup: 3, wakeSpacing: 2 * time.Millisecond,
			idleWindow: 300 * time.Millisecond,
		}
	}
	return peerSizes{
		rounds: 3, appendDuration: time.Second, appendWriters: []int{1, 16},
		events:      20_000,
		wakeAppends: 100, wakeWarmup: 10, wakeSpacing: 3 * time.Millisecond,
		idleWindow: 3 * time.Second,
	}
}

const (
	// peerPoll is watermill-sql's poll interval here: 1 ms, as the issue
	// measured it (its default is 1 s), its only way to see new rows.
	peerPoll = time.Millisecond
	// peerBatch is both sides' batch: the library's DefaultBatchSize and
	// PostgreSQLQueueSchema's default SubscribeBatchSize.
	peerBatch = 100
	// peerReplicas is how many consumers share one feed.
	peerReplicas = 4
	// peerProjection is the projection each side's handler writes, one
	// upsert per event, in the batch's transaction.
	peerProjection = `CREATE TABLE peer_projection (event_id text NOT NULL PRIMARY KEY, calls integer NOT NULL)`
	peerUpsert     = `INSERT INTO peer_projection (event_id, calls) VALUES (?, 1)
		ON CONFLICT (event_id) DO UPDATE SET calls = peer_projection.calls + 1`
	peerProjectionCount = `SELECT COUNT(*), COALESCE(SUM(calls), 0) FROM peer_projection`
)

// peerContender is one side of scenario 13.
type peerContender interface {
	// appendRate appends single events from writers goroutines for the
	// append duration and returns events per second.
	appendRate(ctx context.Context, writers int) (float64, error)
	// catchUp has consumers consumers of one feed drain a backlog of
	// events into the projection.
	catchUp(ctx context.Context, consumers int) (peerCatchup, error)
	// wake returns, per timed append, append start -> handler start.
	wake(ctx context.Context) ([]time.Duration, error)
	// idle counts the transactions of one caught-up consumer.
	idle(ctx context.Context) (peerIdle, error)
}

type peerCatchup struct {
	elapsed time.Duration
	// dupCommitted is projection rows written more than once.
	dupCommitted int64
	// conflicts is watermill-sql's polls repeated after a serialization
	// failure (wmPeer.conflicts).
	conflicts int64
}

type peerIdle struct {
	commits, single, rollbacks int64
	window                     time.Duration
	// server is the database's xact_commit rate (pg_stat_database) over
	// the window: every session's, others' too; NaN when unreadable.
	server float64
}

func (m peerIdle) perSecond(v int64) float64 { return float64(v) / m.window.Seconds() }

// runPeer: scenario 13.
func runPeer(ctx context.Context, b *bench) ([]Row, error) {
	sz := b.peerSizes()
	lib, err := newLibPeer(ctx, b, sz)
	if err != nil {
		return nil, fmt.Errorf("library: %w", err)
	}
	wm, err := newWatermillPeer(ctx, b, sz)
	if err != nil {
		return nil, fmt.Errorf("watermill-sql: %w", err)
	}
	sides := []peerContender{lib, wm}
	names := []string{"library", "watermill-sql"}
	// vals[side][measure] holds one value per round.
	vals := []map[string][]float64{{}, {}}
	var loads []string
	for round := range sz.rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		each := func(what string, fn func(side int, c peerContender) error) error {
			for _, i := range order {
				if err := fn(i, sides[i]); err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", round+1, what, names[i], err)
				}
			}
			return nil
		}
		put := func(side int, key string, v float64) { vals[side][key] = append(vals[side][key], v) }
		before := loadAvg()
		for _, w := range sz.appendWriters {
			if err := each(fmt.Sprintf("appends, %d writers", w), func(i int, c peerContender) error {
				r, err := c.appendRate(ctx, w)
				put(i, fmt.Sprintf("append %d", w), r)
				return err
			}); err != nil {
				return nil, err
			}
		}
		for _, n := range []int{1, peerReplicas} {
			if err := each(fmt.Sprintf("catch-up, %d consumers", n), func(i int, c peerContender) error {
				r, err := c.catchUp(ctx, n)
				put(i, fmt.Sprintf("catchup %d", n), float64(sz.events)/r.elapsed.Seconds())
				put(i, fmt.Sprintf("dup %d", n), float64(r.dupCommitted))
				put(i, fmt.Sprintf("conflicts %d", n), float64(r.conflicts))
				return err
			}); err != nil {
				return nil, err
			}
		}
		if err := each("wake latency", func(i int, c peerContender) error {
			lat, err := c.wake(ctx)
			lat = sortedCopy(lat)
			put(i, "wake p50", percentile(lat, 50))
			put(i, "wake p99", percentile(lat, 99))
			return err
		}); err != nil {
			return nil, err
		}
		if err := each("idle", func(i int, c peerContender) error {
			m, err := c.idle(ctx)
			put(i, "idle commits", m.perSecond(m.commits))
			put(i, "idle tx", m.perSecond(m.commits+m.single+m.rollbacks))
			put(i, "idle server", m.server)
			return err
		}); err != nil {
			return nil, err
		}
		loads = append(loads, before+" -> "+loadAvg())
		b.logf("peer: round %d of %d done (load %s)", round+1, sz.rounds, loads[round])
	}
	return peerRows(b, sz, vals, loads, wm.errors.Load()), nil
}

// peerRows turns the rounds' values into the scenario's rows: medians,
// the library's as the figure, watermill-sql's as the baseline.
func peerRows(b *bench, sz peerSizes, vals []map[string][]float64, loads []string, wmErrors int64) []Row {
	lib, wm := vals[0], vals[1]
	perRound := func(key, unit string) string {
		parts := make([]string, len(lib[key]))
		for i := range lib[key] {
			parts[i] = formatValue(lib[key][i], unit) + " / " + formatValue(wm[key][i], unit)
		}
		return "rounds (library / watermill-sql): " + strings.Join(parts, ", ")
	}
	row := func(name, key, unit, bname, before string) Row {
		r := newRow(name, median(lib[key]), median(wm[key]), unit, bname).note(perRound(key, unit))
		if before != "" {
			r = r.note("issue 31 measured before: " + before)
		}
		return r
	}
	common := fmt.Sprintf("%d rounds, the side that goes first alternating; medians of the rounds; load average per round %s; each side on a schema of its own; "+
		"library: GORM backend (GormEventStore, GormCheckpointStore), a notify channel of this run's own; watermill-sql v4 Postgres queue schema (acked rows marked, its default), pgx's database/sql driver, batch %d both",
		sz.rounds, strings.Join(loads, ", "), peerBatch)
	var rows []Row
	for i, w := range sz.appendWriters {
		writersLabel := fmt.Sprintf("%d writers", w)
		if w == 1 {
			writersLabel = "1 writer"
		}
		r := row("appends, one event each, "+writersLabel, fmt.Sprintf("append %d", w), "ev/s",
			"watermill-sql's Publisher (one INSERT, its own implicit transaction), pool of as many connections as writers",
			"ours 0.5-0.8 of its publisher")
		if i == 0 {
			r = r.note(common)
		}
		rows = append(rows, r.note("library: GormEventStore.Append (version check, append lock, NOTIFY; concurrent appends coalesced), same pool size; each writer its own aggregate"))
	}
	catch := fmt.Sprintf("%s events appended before the consumer starts; the handler upserts one projection row per event in the batch's transaction (library: TxFromContext; watermill-sql: sql.TxFromContext, acked after the upsert); time from start until the last event's checkpoint (library) or ack (watermill-sql) is committed",
		groupThousands(float64(sz.events)))
	rows = append(rows, row(fmt.Sprintf("catch-up, %s events into a projection", groupThousands(float64(sz.events))), "catchup 1", "ev/s",
		"watermill-sql's transactional handler, one subscriber, same events and upsert", "ours 2.3x").note(catch))
	rows = append(rows, row(fmt.Sprintf("%d replicas vs %d consumers: total throughput", peerReplicas, peerReplicas), fmt.Sprintf("catchup %d", peerReplicas), "ev/s",
		fmt.Sprintf("%d watermill-sql subscribers of the one queue, each on a pool of its own", peerReplicas), "2x").
		note(fmt.Sprintf("the same backlog and handler; library: %d subscribers of one name, each on a pool of its own (poll interval 100 ms); scaling over one consumer, median: library %.2f, watermill-sql %.2f; watermill-sql's consumers lock the same rows (SELECT ... FOR UPDATE, REPEATABLE READ): median %.0f polls per catch-up repeated after a serialization failure",
			peerReplicas, median(lib[fmt.Sprintf("catchup %d", peerReplicas)])/median(lib["catchup 1"]), median(wm[fmt.Sprintf("catchup %d", peerReplicas)])/median(wm["catchup 1"]),
			median(wm[fmt.Sprintf("conflicts %d", peerReplicas)]))))
	dupKey := fmt.Sprintf("dup %d", peerReplicas)
	var libDup, wmDup int64
	for i := range lib[dupKey] {
		libDup += int64(lib[dupKey][i] + lib["dup 1"][i])
		wmDup += int64(wm[dupKey][i] + wm["dup 1"][i])
	}
	r := newRow("catch-ups: duplicate committed writes, all rounds", float64(libDup), float64(wmDup), "count", "watermill-sql, the same catch-ups").goal("0", libDup == 0)
	r.Duplicates = &libDup
	rows = append(rows, r)
	wake := fmt.Sprintf("%d appends of one event each, one after another, %s apart, after %d untimed; library: PostgresListener wake-up, poll interval 1 s; watermill-sql: poll interval %s; append start -> handler start; writers on one connection each",
		sz.wakeAppends, sz.wakeSpacing, sz.wakeWarmup, peerPoll)
	for _, p := range []struct {
		name, key, before string
	}{{"p50", "wake p50", "2.6 ms vs 102 ms on a busy server, 1.4 vs 2.2 ms on a quiet one"}, {"p99", "wake p99", ""}} {
		rows = append(rows, row("append->handler "+p.name, p.key, "ms", "watermill-sql, poll interval 1 ms", p.before).note(wake))
	}
	idle := fmt.Sprintf("one consumer, caught up, for %s, counted at the driver (pgx tracer); library: PostgresListener wake-up and the default 1 s poll (2 statements per poll, no transaction); watermill-sql: a REPEATABLE READ transaction per 1 ms poll", sz.idleWindow)
	rows = append(rows, row("idle: COMMITs per second", "idle commits", "/s", "watermill-sql, poll interval 1 ms", "0 commits/s vs 400").note(idle))
	rows = append(rows, row("idle: transactions per second, single statements included", "idle tx", "/s", "watermill-sql, poll interval 1 ms", "").
		note("every statement outside BEGIN/COMMIT is a transaction of its own on the server (what pg_stat_database's xact_commit counts)").
		note(fmt.Sprintf("pg_stat_database xact_commit of the whole database (every session's, others' too) during the windows, median: %.0f/s (library's) vs %.0f/s (watermill-sql's)",
			median(lib["idle server"]), median(wm["idle server"]))))
	if wmErrors > 0 {
		b.note(fmt.Sprintf("peer: watermill-sql logged %d errors (run with -v to see them)", wmErrors))
	}
	return rows
}

// peerTimedAppends appends warmup+n single events one after another
// (appendOne returns the event's ID), waiting for each to reach the
// handler (hits) and sleeping the spacing in between, and returns append
// start -> handler start of the last n.
func peerTimedAppends(ctx context.Context, sz peerSizes, appendOne func(ctx context.Context, i int) (string, error), hits <-chan hit) ([]time.Duration, error) {
	var out []time.Duration
	for i := range sz.wakeWarmup + sz.wakeAppends {
		t0 := time.Now()
		id, err := appendOne(ctx, i)
		if err != nil {
			return out, fmt.Errorf("append %d: %w", i, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var at time.Time
		for at.IsZero() && err == nil {
			select {
			case h := <-hits:
				if h.id == id {
					at = h.at
				}
			case <-wctx.Done():
				err = fmt.Errorf("the handler did not see event %d (%s): %w", i, id, wctx.Err())
			}
		}
		cancel()
		if err != nil {
			return out, err
		}
		if i >= sz.wakeWarmup {
			out = append(out, at.Sub(t0))
		}
		if !ctxsleep.Sleep(ctx, sz.wakeSpacing) {
			return out, ctx.Err()
		}
	}
	return out, nil
}

// txCounter counts, at the driver, the transactions a pool's sessions end
// on the server: COMMITs, ROLLBACKs, and statements sent outside a
// transaction (each its own).
type txCounter struct {
	on                         atomic.Bool
	commits, single, rollbacks atomic.Int64
}

func (c *txCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !c.on.Load() {
		return ctx
	}
	sql := strings.ToLower(strings.TrimSpace(data.SQL))
	switch {
	case strings.HasPrefix(sql, "commit"):
		c.commits.Add(1)
	case strings.HasPrefix(sql, "rollback"):
		c.rollbacks.Add(1)
	case strings.HasPrefix(sql, "begin"):
	case conn.PgConn().TxStatus() == 'I':
		c.single.Add(1)
	}
	return ctx
}

func (c *txCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// measurePeerIdle counts c's transactions over the window, and the
// database's commits (pg_stat_database) beside them.
func measurePeerIdle(ctx context.Context, b *bench, c *txCounter, window time.Duration) (peerIdle, error) {
	server0, ok0 := databaseCommits(ctx, b)
	c.commits.Store(0)
	c.single.Store(0)
	c.rollbacks.Store(0)
	t0 := time.Now()
	c.on.Store(true)
	slept := ctxsleep.Sleep(ctx, window)
	c.on.Store(false)
	m := peerIdle{commits: c.commits.Load(), single: c.single.Load(), rollbacks: c.rollbacks.Load(), window: time.Since(t0), server: math.NaN()}
	server1, ok1 := databaseCommits(ctx, b)
	if ok0 && ok1 {
		m.server = float64(server1-server0) / m.window.Seconds()
	}
	if !slept {
		return m, ctx.Err()
	}
	return m, nil
}

// databaseCommits is pg_stat_database's xact_commit of the bench's
// database, read on a connection of its own (a fresh statistics snapshot).
func databaseCommits(ctx context.Context, b *bench) (int64, bool) {
	conn, err := pgx.Connect(ctx, b.cfg.DSN)
	if err != nil {
		return 0, false
	}
	defer conn.Close(context.Background())
	var n int64
	if err := conn.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		return 0, false
	}
	return n, true
}

// libPeer is the library's side of scenario 13: the GORM backend on a
// schema of its own, its backlog appended once (positions 1..n; what the
// other measures append comes after it and is cut off from the catch-ups).
type libPeer struct {
	b       *bench
	sz      peerSizes
	dsn     string
	channel string
	setup   *gorm.DB
	cps     *subscriptions.GormCheckpointStore // on setup: resets, positions
	n       int64
	runs    int // for fresh subscriber names
}

func newLibPeer(ctx context.Context, b *bench, sz peerSizes) (*libPeer, error) {
	dsn, err := b.newSchema(ctx, "peer_lib")
	if err != nil {
		return nil, err
	}
	setup, err := b.openPG(dsn, 2, nil)
	if err != nil {
		return nil, err
	}
	p := &libPeer{b: b, sz: sz, dsn: dsn, channel: b.runID + "_peer", setup: setup}
	store, err := p.store(setup)
	if err != nil {
		return nil, err
	}
	if err := fillStore(ctx, store, sz.events, peerBatch); err != nil {
		return nil, err
	}
	if err := execAll(setup, peerProjection, "ANALYZE"); err != nil {
		return nil, err
	}
	if p.n, err = store.HeadPosition(ctx); err != nil {
		return nil, err
	}
	if p.cps, err = subscriptions.NewGormCheckpointStore(setup); err != nil {
		return nil, err
	}
	return p, nil
}

// store is an event store on db that notifies on this run's own channel,
// so that no other process's appends wake the scenario's subscribers.
func (p *libPeer) store(db *gorm.DB) (*infrastructure.GormEventStore, error) {
	return infrastructure.NewGormEventStore(db, infrastructure.WithNotifyChannel(p.channel))
}

// onPool opens a pool of maxConns with the backend's stores on it, closed
// with the case.
func (p *libPeer) onPool(maxConns int, tracer pgx.QueryTracer) (*infrastructure.GormEventStore, *subscriptions.GormCheckpointStore, error) {
	db, err := p.b.openPG(p.dsn, maxConns, tracer)
	if err != nil {
		return nil, nil, err
	}
	store, err := p.store(db)
	if err != nil {
		return nil, nil, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(db)
	return store, cps, err
}

// name is a subscriber name not used before in the run, its checkpoint
// reset to position.
func (p *libPeer) name(ctx context.Context, what string, position int64) (string, error) {
	p.runs++
	name := fmt.Sprintf("peer-%s-%d", what, p.runs)
	return name, p.cps.Reset(ctx, name, position)
}

func (p *libPeer) appendRate(ctx context.Context, writers int) (float64, error) {
	defer p.b.casePools()()
	store, _, err := p.onPool(writers, nil)
	if err != nil {
		return 0, err
	}
	res, err := timedWriters(ctx, writers, p.sz.appendDuration, func(ctx context.Context, w, k int) error {
		return store.Append(ctx, fmt.Sprintf("peer-append-%d", w), -1, makeEvents(1, k)...)
	}, nil)
	return float64(len(res.latencies)) / res.elapsed.Seconds(), err
}

func (p *libPeer) catchUp(ctx context.Context, consumers int) (peerCatchup, error) {
	defer p.b.casePools()()
	var res peerCatchup
	if err := p.setup.Exec("TRUNCATE peer_projection").Error; err != nil {
		return res, err
	}
	name, err := p.name(ctx, "catchup", 0)
	if err != nil {
		return res, err
	}
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tx := subscriptions.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no batch transaction")
		}
		return tx.Exec(peerUpsert, ev.ID).Error
	}
	subs := make([]*subscriptions.Subscriber, consumers)
	for i := range subs {
		store, cps, err := p.onPool(2, nil)
		if err != nil {
			return res, err
		}
		if subs[i], err = subscriptions.NewSubscriber(name, &cappedStore{EventStore: store, max: p.n}, cps, handler,
			subscriptions.WithBatchSize(peerBatch), subscriptions.WithPollInterval(100*time.Millisecond), subscriptions.WithLogger(p.b.libLogger())); err != nil {
			return res, err
		}
	}
	if res.elapsed, err = runSubscribersUntil(ctx, subs, 2*time.Millisecond, func() (bool, error) {
		pos, err := p.cps.Position(ctx, name)
		return pos >= p.n, err
	}); err != nil {
		return res, err
	}
	var rows, calls int64
	if err := p.setup.WithContext(ctx).Raw(peerProjectionCount).Row().Scan(&rows, &calls); err != nil {
		return res, err
	}
	if rows != p.n {
		return res, fmt.Errorf("the projection holds %d rows, want %d", rows, p.n)
	}
	res.dupCommitted = calls - rows
	return res, nil
}

func (p *libPeer) wake(ctx context.Context) ([]time.Duration, error) {
	defer p.b.casePools()()
	writer, _, err := p.onPool(1, nil)
	if err != nil {
		return nil, err
	}
	total := p.sz.wakeWarmup + p.sz.wakeAppends
	hits := make(chan hit, total+16)
	handler := func(_ context.Context, ev domain.EventEnvelope[any]) error {
		select {
		case hits <- hit{ev.ID, time.Now()}:
		default:
		}
		return nil
	}
	stop, err := p.subscribe(ctx, "wake", nil, handler)
	if err != nil {
		return nil, err
	}
	lat, err := peerTimedAppends(ctx, p.sz, func(ctx context.Context, i int) (string, error) {
		ev := makeEvents(1, i)[0]
		return ev.ID, writer.Append(ctx, "peer-wake", -1, ev)
	}, hits)
	return lat, errors.Join(err, stop())
}

func (p *libPeer) idle(ctx context.Context) (peerIdle, error) {
	defer p.b.casePools()()
	counter := &txCounter{}
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	stop, err := p.subscribe(ctx, "idle", counter, noop)
	if err != nil {
		return peerIdle{}, err
	}
	ctxsleep.Sleep(ctx, 100*time.Millisecond) // its first, catching-up cycle is over
	m, err := measurePeerIdle(ctx, p.b, counter, p.sz.idleWindow)
	return m, errors.Join(err, stop())
}

// subscribe runs a subscriber from the feed's head, on a pool of its own
// (tracer, when set, seeing its statements), woken by a PostgresListener
// on the run's channel, poll interval the default; stop ends both.
func (p *libPeer) subscribe(ctx context.Context, what string, tracer pgx.QueryTracer, handler subscriptions.Handler) (stop func() error, err error) {
	store, cps, err := p.onPool(2, tracer)
	if err != nil {
		return nil, err
	}
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return nil, err
	}
	name, err := p.name(ctx, what, head)
	if err != nil {
		return nil, err
	}
	listener, err := subscriptions.NewPostgresListener(p.dsn, subscriptions.WithListenerChannel(p.channel), subscriptions.WithListenerLogger(p.b.libLogger()))
	if err != nil {
		return nil, err
	}
	sub, err := subscriptions.NewSubscriber(name, store, cps, handler,
		subscriptions.WithWakeSignal(listener.Subscribe()), subscriptions.WithLogger(p.b.libLogger()))
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	lerr, serr := make(chan error, 1), make(chan error, 1)
	go func() { lerr <- listener.Run(rctx) }()
	go func() { serr <- sub.Run(rctx) }()
	return func() error {
		cancel()
		return errors.Join(<-lerr, <-serr)
	}, nil
}
