package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
	"github.com/eventfeed/subscriptions/internal/wirecount"
	"github.com/eventfeed/subscriptions/migrations"
)

// Scenario 15: many tenants, one schema each, run by a subscriptions.Group
// against what a user writes without one (a standalone Subscriber per
// tenant and definition, each polling on its own).

// tenantDefs are the definitions every tenant runs (two, as the issue
// asks).
var tenantDefs = []string{"a", "b"}

// tenantDatabase is the Feed.Database of every tenant: one server.
const tenantDatabase = "main"

// connGauge counts the connections open at once through the pools it
// dials for (every pool of the scenario's subscribers), and their peak
// since the last reset. limit, when positive, caps them: a dial waits for
// a slot (waits counts how often), so that a configuration needing more
// connections than the budget cannot take the server's.
type connGauge struct {
	open, peak, waits atomic.Int64
	// slots, when set, caps the connections dialled meanwhile.
	slots atomic.Pointer[chan struct{}]
}

// capAt caps the connections dialled from now on at limit (0: no cap).
func (g *connGauge) capAt(limit int) {
	if limit <= 0 {
		g.slots.Store(nil)
		return
	}
	ch := make(chan struct{}, limit)
	g.slots.Store(&ch)
}

// dial wraps a pgx DialFunc: each connection takes a slot (if capped) and
// is counted until closed.
func (g *connGauge) dial(inner pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var slots chan struct{}
		if p := g.slots.Load(); p != nil {
			slots = *p
			select {
			case slots <- struct{}{}:
			default:
				g.waits.Add(1)
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		conn, err := inner(ctx, network, addr)
		if err != nil {
			if slots != nil {
				<-slots
			}
			return nil, err
		}
		n := g.open.Add(1)
		for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
		}
		return &gaugedConn{Conn: conn, g: g, slots: slots}, nil
	}
}

// reset starts a new peak (and wait count) from the connections open now.
func (g *connGauge) reset() {
	g.peak.Store(g.open.Load())
	g.waits.Store(0)
}

type gaugedConn struct {
	net.Conn
	g     *connGauge
	slots chan struct{} // the cap's slot it holds; nil if dialled uncapped
	once  sync.Once
}

func (c *gaugedConn) Close() error {
	c.once.Do(func() {
		c.g.open.Add(-1)
		if c.slots != nil {
			<-c.slots
		}
	})
	return c.Conn.Close()
}

// tenantEnv is scenario 15's wiring: the template schema, the tenants'
// schemas and stores, and the counters every subscriber pool reports to.
type tenantEnv struct {
	b       *bench
	sz      tenantSizes
	dsn     string // the template schema's DSN (search_path, application_name)
	tmpl    string // the template schema, migrated by the module
	schemas []string
	channel string // the NOTIFY channel of every tenant's store
	gauge   *connGauge
	stmts   *wirecount.Counter // every statement of the subscribers' pools (its tracer)
	shared  *gorm.DB           // every tenant's stores (WithSchema)
	feeds   []subscriptions.Feed
	writers []domain.EventStore // the busy tenants', the application's side
}

// tenantSizes are scenario 15's sizes.
type tenantSizes struct {
	tenants, small, busy int
	// handCounts are the tenant counts the hand-written loop is measured at.
	handCounts     []int
	interval       time.Duration // every poll interval, group's and standalone's
	window, settle time.Duration
	busyEvents     int // per busy tenant
	rounds         int
	wakeAppends    int // in all, round robin over the busy tenants
	wakeSpacing    time.Duration
	workers        int
	budget         int // cap on the hand loop's connections
}

func (b *bench) tenantSizes() tenantSizes {
	if b.cfg.Quick {
		return tenantSizes{tenants: 20, small: 4, busy: 3, handCounts: []int{4, 20}, interval: 200 * time.Millisecond,
			window: time.Second, settle: 500 * time.Millisecond, busyEvents: 200, rounds: 1,
			wakeAppends: 15, wakeSpacing: 5 * time.Millisecond, workers: 4, budget: 12}
	}
	return tenantSizes{tenants: 500, small: 10, busy: 10, handCounts: []int{10, 50, 500}, interval: time.Second,
		window: 8 * time.Second, settle: 3 * time.Second, busyEvents: 2000, rounds: 3,
		wakeAppends: 300, wakeSpacing: 10 * time.Millisecond, workers: 4, budget: 20}
}

// runTenants: scenario 15.
func runTenants(ctx context.Context, b *bench) (rows []Row, err error) {
	sz := b.tenantSizes()
	dsn, err := b.newSchema(ctx, "tenants")
	if err != nil {
		return nil, err
	}
	e := &tenantEnv{b: b, sz: sz, dsn: dsn, tmpl: b.runID + "_tenants", channel: b.runID + "_tenants",
		gauge: &connGauge{}, stmts: &wirecount.Counter{}}
	// The template: the module's migrations, once.
	closeSetup := b.casePools()
	tdb, err := b.openPG(dsn, 1, nil)
	if err != nil {
		return nil, err
	}
	if _, err := infrastructure.NewGormEventStore(tdb); err != nil {
		return nil, err
	}
	t0 := time.Now()
	err = e.createTenants(ctx)
	closeSetup()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, e.dropTenants()) }()
	created := time.Since(t0)
	// The shared pool may open up to the hand loop's cap; the group keeps
	// within its own budget on it (workers + the probe), and it keeps that
	// many idle so that a busy group does not dial per cycle.
	if e.shared, err = e.openPool(dsn, sz.budget, sz.workers+1); err != nil {
		return nil, err
	}
	t0 = time.Now()
	for _, s := range e.schemas {
		f, err := e.tenantFeed(s)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", s, err)
		}
		e.feeds = append(e.feeds, f)
	}
	b.note(fmt.Sprintf("tenants: %d schemas cloned from a migrated template in one script in %s; their stores built in %s",
		sz.tenants, created.Round(100*time.Millisecond), time.Since(t0).Round(100*time.Millisecond)))

	probe, err := e.probeTime(ctx, false)
	if err != nil {
		return nil, err
	}
	warmProbe, err := e.probeTime(ctx, true)
	if err != nil {
		return nil, err
	}

	// Idle: the hand-written loop, then the group, at a few tenants and at
	// all of them.
	hand := map[int]idleCost{}
	for _, n := range sz.handCounts {
		c, err := e.handIdle(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("hand-written loop, %d tenants: %w", n, err)
		}
		hand[n] = c
	}
	g, err := e.run(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, g.stop()) }()
	if err := g.add(0, sz.small); err != nil {
		return nil, err
	}
	small, err := e.measureIdle(ctx, sz.small, true)
	if err != nil {
		return nil, err
	}
	if err := g.add(sz.small, sz.tenants); err != nil {
		return nil, err
	}
	all, err := e.measureIdle(ctx, sz.tenants, true)
	if err != nil {
		return nil, err
	}
	rows = append(rows, e.idleRows(small, all, hand)...)
	rows = append(rows, newRow(fmt.Sprintf("the group's probe: one ProbeHeads of %d tenants, median of 5", sz.tenants), probe, warmProbe, "ms", "the same on a connection kept open (diagnostic)").
		note("the probe statement the group runs per poll interval and per wake-up, timed alone, on the shared pool the group runs on (its connections kept, so their backends' catalog caches stay warm after a first read of every tenant's table)"))

	// Busy: sz.busy tenants among the idle ones.
	lib, solo, err := e.busy(ctx, g)
	if err != nil {
		return rows, err
	}
	return append(rows, e.busyRows(lib, solo)...), nil
}

// probeTime times ProbeHeads of every tenant's store, as the group's
// probe runs it, 5 times: the median in ms. warm, when set, is the same
// on a pool that keeps its connection (its backend's catalog cache warm).
func (e *tenantEnv) probeTime(ctx context.Context, warm bool) (float64, error) {
	var first domain.EventStore = e.feeds[0].Events
	if warm {
		defer e.b.casePools()()
		db, err := e.b.openPGAs(e.schemaDSN(e.schemas[0]), "tenants_probe", 1, nil)
		if err != nil {
			return 0, err
		}
		if first, err = infrastructure.NewGormEventStore(db, infrastructure.WithNotifyChannel(e.channel)); err != nil {
			return 0, err
		}
	}
	prober, ok := first.(subscriptions.HeadProber)
	if !ok {
		return 0, fmt.Errorf("the event store %T is no HeadProber", first)
	}
	stores := make([]domain.EventStore, len(e.feeds))
	for i, f := range e.feeds {
		stores[i] = f.Events
	}
	var ms []float64
	if warm {
		if _, err := prober.ProbeHeads(ctx, stores); err != nil { // warms it
			return 0, err
		}
	}
	for range 5 {
		t0 := time.Now()
		if _, err := prober.ProbeHeads(ctx, stores); err != nil {
			return 0, err
		}
		ms = append(ms, float64(time.Since(t0))/float64(time.Millisecond))
	}
	return median(ms), nil
}

// schemaDSN is e.dsn selecting schema.
func (e *tenantEnv) schemaDSN(schema string) string {
	u, _ := url.Parse(e.dsn) // newSchema parsed it
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// openPool opens a pool of the scenario's subscribers on dsn: its
// connections counted by the gauge, its statements by the counter.
func (e *tenantEnv) openPool(dsn string, maxOpen, maxIdle int) (*gorm.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.RuntimeParams["application_name"] = e.b.runID + "_tenants"
	cfg.Tracer = e.stmts
	cfg.DialFunc = e.gauge.dial(cfg.DialFunc)
	sqlDB := stdlib.OpenDB(*cfg)
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxIdle)
	e.b.pools = append(e.b.pools, sqlDB.Close)
	return gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
}

// tenantFeed builds one tenant's stores: the one place that says how.
// Every store names the tenant's schema on the one shared pool
// (infrastructure.WithSchema, subscriptions.WithSchema), as
// docs/tenants.md says: no pool per tenant.
func (e *tenantEnv) tenantFeed(schema string) (subscriptions.Feed, error) {
	events, err := infrastructure.NewGormEventStore(e.shared, infrastructure.WithSchema(schema), infrastructure.WithNotifyChannel(e.channel))
	if err != nil {
		return subscriptions.Feed{}, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(e.shared, subscriptions.WithSchema(schema))
	if err != nil {
		return subscriptions.Feed{}, err
	}
	lot, err := subscriptions.NewGormParkingLot(e.shared, subscriptions.WithSchema(schema))
	if err != nil {
		return subscriptions.Feed{}, err
	}
	return subscriptions.Feed{Tenant: schema, Database: tenantDatabase, Events: events, Checkpoints: cps, Parking: lot}, nil
}

// cloneTenantsSQL creates the tenants' schemas as copies of the template
// tmpl (tables, keys and indexes under their own names, triggers, the
// migrations' records): one statement, committing every 20 tenants so
// that it stays within the server's lock table (max_locks_per_transaction).
// %[1]s: the template, %[2]s: the prefix of the tenants' names, %[3]d: how
// many; the names are the bench's own (hex and underscores).
const cloneTenantsSQL = `DO $bench$
DECLARE
	tmpl text := '%[1]s';
	s text;
	r record;
BEGIN
	FOR i IN 0..%[3]d - 1 LOOP
		s := '%[2]s' || i::text;
		EXECUTE format('CREATE SCHEMA %%I', s);
		FOR r IN SELECT relname FROM pg_class WHERE relnamespace = tmpl::regnamespace AND relkind = 'r' LOOP
			EXECUTE format('CREATE TABLE %%I.%%I (LIKE %%I.%%I INCLUDING DEFAULTS)', s, r.relname, tmpl, r.relname);
		END LOOP;
		FOR r IN SELECT c.conname, t.relname, pg_get_constraintdef(c.oid) AS def FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
				WHERE t.relnamespace = tmpl::regnamespace AND c.contype IN ('p', 'u') LOOP
			EXECUTE format('ALTER TABLE %%I.%%I ADD CONSTRAINT %%I %%s', s, r.relname, r.conname, r.def);
		END LOOP;
		FOR r IN SELECT pg_get_indexdef(x.indexrelid) AS def FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid
				WHERE t.relnamespace = tmpl::regnamespace AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
			UNION ALL
			SELECT pg_get_triggerdef(g.oid) FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid
				WHERE t.relnamespace = tmpl::regnamespace AND NOT g.tgisinternal LOOP
			EXECUTE replace(r.def, ' ON ' || tmpl || '.', ' ON ' || s || '.');
		END LOOP;
		EXECUTE format('INSERT INTO %%I.subscriptions_schema_migrations SELECT * FROM %%I.subscriptions_schema_migrations', s, tmpl);
		IF i %% 20 = 19 THEN
			COMMIT;
		END IF;
	END LOOP;
END
$bench$`

// dropTenantsSQL drops the tenants' schemas, committing every 20.
const dropTenantsSQL = `DO $bench$
BEGIN
	FOR i IN 0..%[2]d - 1 LOOP
		EXECUTE format('DROP SCHEMA IF EXISTS %%I CASCADE', '%[1]s' || i::text);
		IF i %% 20 = 19 THEN
			COMMIT;
		END IF;
	END LOOP;
END
$bench$`

// createTenants runs cloneTenantsSQL on a session of its own (the
// default search_path, so that the catalog prints the template's name)
// and checks one copy against the module's manifest (VerifySchema).
func (e *tenantEnv) createTenants(ctx context.Context) error {
	prefix := e.tmpl + "_t"
	for i := range e.sz.tenants {
		e.schemas = append(e.schemas, fmt.Sprintf("%s%d", prefix, i))
	}
	e.b.schemas = append(e.b.schemas, e.schemas...) // dropped by the bench if not by dropTenants
	if err := e.script(ctx, fmt.Sprintf(cloneTenantsSQL, e.tmpl, prefix, e.sz.tenants)); err != nil {
		return fmt.Errorf("clone the template into %d tenant schemas: %w", e.sz.tenants, err)
	}
	db, err := e.b.openPG(e.dsn, 1, nil)
	if err != nil {
		return err
	}
	if err := migrations.VerifySchema(ctx, db, e.schemas[len(e.schemas)-1]); err != nil {
		return fmt.Errorf("a cloned tenant schema: %w", err)
	}
	return nil
}

// dropTenants drops the tenants' schemas in one script.
func (e *tenantEnv) dropTenants() error {
	if len(e.schemas) == 0 {
		return nil
	}
	e.b.closePools() // their sessions' locks must not hold the drop up
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.script(ctx, fmt.Sprintf(dropTenantsSQL, e.tmpl+"_t", len(e.schemas))); err != nil {
		return fmt.Errorf("drop the tenant schemas: %w", err)
	}
	drop := map[string]bool{}
	for _, s := range e.schemas {
		drop[s] = true
	}
	kept := e.b.schemas[:0]
	for _, s := range e.b.schemas {
		if !drop[s] {
			kept = append(kept, s)
		}
	}
	e.b.schemas = kept
	return nil
}

// script runs one DO block outside a transaction block (the simple
// protocol), so that it may COMMIT.
func (e *tenantEnv) script(ctx context.Context, sqlText string) error {
	conn, err := pgx.Connect(ctx, e.b.cfg.DSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sqlText, pgx.QueryExecModeSimpleProtocol)
	return err
}

// idleCost is one idle window's figures.
type idleCost struct {
	tenants     int
	stmtsPerSec float64
	cpuPerSec   time.Duration // process CPU per second of the window
	peak        int64         // connections open at once, at most
	mean        float64       // connections open, sampled mean
	waits       int64         // hand loop: dials that waited for the cap
	settled     time.Duration // the wait before the window (settle)
}

// measureIdle measures the next window: statements and CPU per second and
// the connections held (sampled every 10 ms; the peak is exact).
func (e *tenantEnv) measureIdle(ctx context.Context, tenants int, quiet bool) (idleCost, error) {
	settled, err := e.settle(ctx, quiet)
	if err != nil {
		return idleCost{}, err
	}
	e.gauge.reset()
	s0, cpu0, t0 := e.stmts.Stmts(), processCPU(), time.Now()
	var sum, n int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	end := time.After(e.sz.window)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return idleCost{}, ctx.Err()
		case <-end:
			done = true
		case <-tick.C:
			sum += e.gauge.open.Load()
			n++
		}
	}
	w := time.Since(t0).Seconds()
	c := idleCost{tenants: tenants, stmtsPerSec: float64(e.stmts.Stmts()-s0) / w,
		cpuPerSec: time.Duration(float64(processCPU()-cpu0) / w), peak: e.gauge.peak.Load(),
		mean: float64(sum) / float64(max(n, 1)), waits: e.gauge.waits.Load(), settled: settled}
	return c, nil
}

// settle waits, after a change (subscribers started, tenants added), for
// the first cycles to be over: sz.settle, then, with quiet (the group,
// which polls no idle tenant), until one poll interval runs at most 5
// statements or 30 s have passed. It returns how long it waited, negative
// if the statements never quietened.
func (e *tenantEnv) settle(ctx context.Context, quiet bool) (time.Duration, error) {
	t0 := time.Now()
	if !ctxsleep.Sleep(ctx, e.sz.settle) {
		return 0, ctx.Err()
	}
	if !quiet {
		return time.Since(t0), nil
	}
	for time.Since(t0) < 30*time.Second {
		s0 := e.stmts.Stmts()
		if !ctxsleep.Sleep(ctx, e.sz.interval) {
			return 0, ctx.Err()
		}
		if e.stmts.Stmts()-s0 <= 5 {
			return time.Since(t0), nil
		}
	}
	return -time.Since(t0), nil
}

// handIdle measures the hand-written loop over the first n tenants: a
// standalone Subscriber per tenant and definition, polling every interval
// on its own, started spread over one interval (started at once they
// would all poll at once). Its tenant pools' connections are capped at
// the budget (a dial over it waits).
func (e *tenantEnv) handIdle(ctx context.Context, n int) (idleCost, error) {
	e.gauge.capAt(e.sz.budget)
	defer e.gauge.capAt(0)
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var errs []error
	var mu sync.Mutex
	total := n * len(tenantDefs)
	for i := range n {
		f := e.feeds[i]
		for j, def := range tenantDefs {
			sub, err := subscriptions.NewSubscriber("hand-"+def, f.Events, f.Checkpoints, noopHandler,
				subscriptions.WithPollInterval(e.sz.interval), subscriptions.WithParkingLot(f.Parking),
				subscriptions.WithLogger(e.b.libLogger()))
			if err != nil {
				cancel()
				wg.Wait()
				return idleCost{}, err
			}
			delay := e.sz.interval * time.Duration(i*len(tenantDefs)+j) / time.Duration(total)
			wg.Go(func() {
				if !ctxsleep.Sleep(rctx, delay) {
					return
				}
				if err := sub.Run(rctx); err != nil && !errors.Is(err, context.Canceled) {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	}
	c, err := e.measureIdle(ctx, n, false)
	cancel()
	wg.Wait()
	return c, errors.Join(append(errs, err)...)
}

func noopHandler(context.Context, domain.EventEnvelope[any]) error { return nil }

// tenantSink is what every handler of the busy phases reports to: events
// handled, and (when hits is set) when each was.
type tenantSink struct {
	handled atomic.Int64
	hits    atomic.Pointer[chan hit]
}

func (s *tenantSink) handle(_ context.Context, ev domain.EventEnvelope[any]) error {
	s.handled.Add(1)
	if ch := s.hits.Load(); ch != nil {
		select {
		case *ch <- hit{ev.ID, time.Now()}:
		default:
		}
	}
	return nil
}

// runningGroup is the group under test, running.
type runningGroup struct {
	e        *tenantEnv
	g        *subscriptions.Group
	sink     *tenantSink
	cancel   context.CancelFunc
	done     chan error
	stopped  bool
	listener *subscriptions.PostgresListener
}

// run starts a group of tenantDefs with no tenant, woken by a
// PostgresListener on the tenants' channel.
func (e *tenantEnv) run(ctx context.Context) (*runningGroup, error) {
	listener, err := subscriptions.NewPostgresListener(e.dsn, subscriptions.WithListenerChannel(e.channel),
		subscriptions.WithListenerLogger(e.b.libLogger()))
	if err != nil {
		return nil, err
	}
	sink := &tenantSink{}
	defs := make([]subscriptions.GroupSubscriber, len(tenantDefs))
	for i, d := range tenantDefs {
		defs[i] = subscriptions.GroupSubscriber{Name: d, Handler: sink.handle}
	}
	g, err := subscriptions.NewGroup(defs, subscriptions.WithGroupWorkers(e.sz.workers),
		subscriptions.WithGroupPollInterval(e.sz.interval), subscriptions.WithGroupLogger(e.b.libLogger()),
		subscriptions.WithGroupWakeSignal(tenantDatabase, listener.Subscribe()))
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &runningGroup{e: e, g: g, sink: sink, cancel: cancel, done: make(chan error, 2), listener: listener}
	go func() { r.done <- listener.Run(rctx) }()
	go func() { r.done <- g.Run(rctx) }()
	return r, nil
}

// add adds tenants from..to-1.
func (r *runningGroup) add(from, to int) error {
	for _, f := range r.e.feeds[from:to] {
		if err := r.g.Add(f); err != nil {
			return err
		}
	}
	return nil
}

func (r *runningGroup) stop() error {
	if r.stopped {
		return nil
	}
	r.stopped = true
	r.cancel()
	var errs []error
	for range 2 {
		if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// busyResult is one contestant's busy figures.
type busyResult struct {
	rates []float64       // ev/s per round (deliveries: events x definitions)
	peak  int64           // connections of the subscriber pools at once, during the rounds
	wake  []time.Duration // append start -> handler start
	note  string
}

// fill appends sz.busyEvents to each busy tenant, through the tenant's
// own event store (on the application's side a store of the same pool:
// no writer pool of its own, which would hold a connection per busy
// tenant).
func (e *tenantEnv) fill(ctx context.Context) error {
	for _, f := range e.feeds[:e.sz.busy] {
		e.writers = append(e.writers, f.Events)
		if err := fillStore(ctx, f.Events, e.sz.busyEvents, 100); err != nil {
			return err
		}
	}
	return nil
}

// busyTarget is the deliveries a catch-up of every busy tenant from 0 is.
func (e *tenantEnv) busyTarget(ctx context.Context) (int64, error) {
	var n int64
	for _, w := range e.writers {
		head, err := w.HeadPosition(ctx)
		if err != nil {
			return 0, err
		}
		n += head * int64(len(tenantDefs))
	}
	return n, nil
}

// waitHandled waits until sink has handled target deliveries.
func waitHandled(ctx context.Context, sink *tenantSink, target int64) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for sink.handled.Load() < target {
		if !ctxsleep.Sleep(wctx, time.Millisecond) {
			return fmt.Errorf("handled %d of %d deliveries: %w", sink.handled.Load(), target, wctx.Err())
		}
	}
	return nil
}

// busy measures sz.busy tenants among the idle ones: their feeds filled
// while the group runs every tenant, then rounds alternating between the
// group (each busy checkpoint reset to 0 through Group.Subscriber) and
// the standalone subscribers (a Subscriber per busy tenant and
// definition, started from 0), each timed from its start to its last
// delivery; the group runs idle alongside the standalone rounds, no
// append being made. Then timed single appends, through the group (the
// standalone subscribers stopped), then through the standalone
// subscribers (the group stopped).
func (e *tenantEnv) busy(ctx context.Context, g *runningGroup) (lib, solo busyResult, err error) {
	if err := e.fill(ctx); err != nil {
		return lib, solo, err
	}
	target, err := e.busyTarget(ctx)
	if err != nil {
		return lib, solo, err
	}
	if err := waitHandled(ctx, g.sink, target); err != nil {
		return lib, solo, fmt.Errorf("the group's first catch-up: %w", err)
	}
	s, err := e.newSolo(ctx)
	if err != nil {
		return lib, solo, err
	}
	defer s.close()
	for range e.sz.rounds {
		rate, peak, err := e.groupRound(ctx, g, target)
		if err != nil {
			return lib, solo, err
		}
		lib.rates, lib.peak = append(lib.rates, rate), max(lib.peak, peak)
		e.gauge.reset()
		t0 := time.Now()
		stop, err := s.start(ctx, true)
		if err == nil {
			err = waitHandled(ctx, s.sink, target)
		}
		solo.rates = append(solo.rates, float64(target)/time.Since(t0).Seconds())
		solo.peak = max(solo.peak, e.gauge.peak.Load()+1)
		if err := errors.Join(err, stop()); err != nil {
			return lib, solo, err
		}
	}
	if lib.wake, err = e.timedAppends(ctx, g.sink); err != nil {
		return lib, solo, err
	}
	if err := g.stop(); err != nil {
		return lib, solo, err
	}
	stop, err := s.start(ctx, false) // from where the last round left them: the head
	if err == nil {
		solo.wake, err = e.timedAppends(ctx, s.sink)
	}
	if err := errors.Join(err, stop()); err != nil {
		return lib, solo, err
	}
	lib.note = fmt.Sprintf("the group: %d tenants, %d busy, %d workers, one PostgresListener; throughput from the first ResetCheckpoint(0) through the group to the last delivery", e.sz.tenants, e.sz.busy, e.sz.workers)
	solo.note = fmt.Sprintf("baseline: %d standalone Subscribers (%d busy tenants x %d definitions), each with its own Subscribe() of one PostgresListener; throughput from their start (checkpoints reset to 0) to the last delivery, the group idle alongside (its connections in their peak); rounds alternate", s.n, e.sz.busy, len(tenantDefs))
	return lib, solo, nil
}

// groupRound resets the busy tenants' checkpoints to 0 through the group
// and times their catch-up: deliveries per second and the connections'
// peak.
func (e *tenantEnv) groupRound(ctx context.Context, r *runningGroup, target int64) (float64, int64, error) {
	e.gauge.reset()
	r.sink.handled.Store(0)
	t0 := time.Now()
	for _, f := range e.feeds[:e.sz.busy] {
		for _, d := range tenantDefs {
			sub, err := r.g.Subscriber(f.Tenant, d)
			if err != nil {
				return 0, 0, err
			}
			if err := sub.ResetCheckpoint(ctx, 0); err != nil {
				return 0, 0, err
			}
		}
	}
	if err := waitHandled(ctx, r.sink, target); err != nil {
		return 0, 0, err
	}
	return float64(target) / time.Since(t0).Seconds(), e.gauge.peak.Load() + 1, nil // and the listener's
}

// soloSubs are the standalone subscribers of the busy tenants: one
// PostgresListener, a Subscribe() each.
type soloSubs struct {
	e      *tenantEnv
	sink   *tenantSink
	wakes  []<-chan struct{}
	n      int
	cancel context.CancelFunc
	lerr   chan error
}

func (e *tenantEnv) newSolo(ctx context.Context) (*soloSubs, error) {
	listener, err := subscriptions.NewPostgresListener(e.dsn, subscriptions.WithListenerChannel(e.channel),
		subscriptions.WithListenerLogger(e.b.libLogger()))
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	s := &soloSubs{e: e, sink: &tenantSink{}, n: e.sz.busy * len(tenantDefs), cancel: cancel, lerr: make(chan error, 1)}
	go func() { s.lerr <- listener.Run(lctx) }()
	for range s.n {
		s.wakes = append(s.wakes, listener.Subscribe())
	}
	return s, nil
}

func (s *soloSubs) close() {
	s.cancel()
	<-s.lerr
}

// start runs the standalone subscribers, their checkpoints first reset to
// 0 when reset is set, until stop is called.
func (s *soloSubs) start(ctx context.Context, reset bool) (stop func() error, err error) {
	e := s.e
	s.sink.handled.Store(0)
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, s.n)
	n := 0
	stop = func() error {
		cancel()
		var errs []error
		for range n {
			if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for i, f := range e.feeds[:e.sz.busy] {
		for j, d := range tenantDefs {
			name := "solo-" + d
			if reset {
				if err := f.Checkpoints.(checkpointStore).Reset(ctx, name, 0); err != nil {
					return stop, err
				}
			}
			sub, err := subscriptions.NewSubscriber(name, f.Events, f.Checkpoints, s.sink.handle,
				subscriptions.WithPollInterval(e.sz.interval), subscriptions.WithParkingLot(f.Parking),
				subscriptions.WithWakeSignal(s.wakes[i*len(tenantDefs)+j]), subscriptions.WithLogger(e.b.libLogger()))
			if err != nil {
				return stop, err
			}
			n++
			go func() { errc <- sub.Run(rctx) }()
		}
	}
	return stop, nil
}

// timedAppends appends one event at a time, round robin over the busy
// tenants, and times append start -> each definition's handler start.
func (e *tenantEnv) timedAppends(ctx context.Context, sink *tenantSink) ([]time.Duration, error) {
	hits := make(chan hit, 64)
	sink.hits.Store(&hits)
	defer sink.hits.Store(nil)
	var out []time.Duration
	warmup := max(e.sz.busy, 5)
	for i := range warmup + e.sz.wakeAppends {
		ev := makeEvents(1, i)[0]
		t0 := time.Now()
		if err := e.writers[i%len(e.writers)].Append(ctx, fmt.Sprintf("wake-%d", i), -1, ev); err != nil {
			return out, err
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		for seen := 0; seen < len(tenantDefs); {
			select {
			case h := <-hits:
				if h.id == ev.ID {
					seen++
					if i >= warmup {
						out = append(out, h.at.Sub(t0))
					}
				}
			case <-wctx.Done():
				cancel()
				return out, fmt.Errorf("wake append %d: %d of %d definitions handled it: %w", i, seen, len(tenantDefs), wctx.Err())
			}
		}
		cancel()
		if !ctxsleep.Sleep(ctx, e.sz.wakeSpacing) {
			return out, ctx.Err()
		}
	}
	return out, nil
}

func (e *tenantEnv) idleRows(small, all idleCost, hand map[int]idleCost) []Row {
	sz := e.sz
	handName := func(n int) string {
		return fmt.Sprintf("the hand-written loop over %d tenants: a standalone Subscriber per tenant and definition polling every %s, on the shared pool capped at %d connections", n, sz.interval, sz.budget)
	}
	note := fmt.Sprintf("%d definitions per tenant, poll interval %s, %s windows; statements counted at the driver (pgx tracer, every pool of the subscribers); CPU: this process's user+system (getrusage); connections: every subscriber pool's, peak exact (mean sampled every 10 ms), plus the group's LISTEN connection", len(tenantDefs), sz.interval, sz.window)
	var rows []Row
	note += fmt.Sprintf("; the group's windows began once an interval ran <= 5 statements: %s after %d tenants, %s after %d (negative: never)", small.settled.Round(100*time.Millisecond), small.tenants, all.settled.Round(100*time.Millisecond), all.tenants)
	for _, c := range []idleCost{small, all} {
		h, ok := hand[c.tenants]
		if !ok {
			h = hand[sz.handCounts[len(sz.handCounts)-1]]
		}
		hn := handName(h.tenants)
		rows = append(rows,
			newRow(fmt.Sprintf("group, %d tenants idle: statements/s", c.tenants), c.stmtsPerSec, h.stmtsPerSec, "stmts/s", hn).note(note),
			newRow(fmt.Sprintf("group, %d tenants idle: process CPU/s", c.tenants), float64(c.cpuPerSec.Microseconds())/1000, float64(h.cpuPerSec.Microseconds())/1000, "ms/s", hn),
			newRow(fmt.Sprintf("group, %d tenants idle: connections held, peak (mean %.2f; hand loop %.2f)", c.tenants, c.mean+1, h.mean), float64(c.peak+1), float64(h.peak), "count", hn).
				goal(fmt.Sprintf("<= budget %d (workers + probe + listener)", sz.workers+2), c.peak+1 <= int64(sz.workers+2)),
		)
	}
	flat := "<= 2 (flat in the number of tenants)"
	rows = append(rows,
		// Windows of whole probes: compare at 2 decimals, as scenario 6 does.
		newRow(fmt.Sprintf("group idle statements/s, %d vs %d tenants", sz.tenants, sz.small), all.stmtsPerSec, small.stmtsPerSec, "stmts/s", fmt.Sprintf("the group at %d tenants", sz.small)).
			goal(flat, math.Round(100*all.stmtsPerSec/small.stmtsPerSec)/100 <= 2).
			note("an idle group's statements are its probe: one statement per 256 tenants (probeChunk) per interval"),
		newRow(fmt.Sprintf("group idle process CPU/s, %d vs %d tenants", sz.tenants, sz.small), float64(all.cpuPerSec.Microseconds())/1000, float64(small.cpuPerSec.Microseconds())/1000, "ms/s", fmt.Sprintf("the group at %d tenants", sz.small)).
			goal(flat, all.cpuPerSec <= 2*small.cpuPerSec),
	)
	for _, n := range sz.handCounts {
		h := hand[n]
		expected := float64(n*len(tenantDefs)) / sz.interval.Seconds()
		r := newRow(fmt.Sprintf("hand-written loop, %d tenants: idle statements/s (ratio: per poll due)", n), h.stmtsPerSec, expected, "stmts/s", "polls due: one per subscriber and interval").
			note(fmt.Sprintf("hand loop at %d tenants: CPU %.1f ms/s, connections peak %d (mean %.2f), %d dials waited for the cap of %d", n, float64(h.cpuPerSec.Microseconds())/1000, h.peak, h.mean, h.waits, sz.budget))
		// It fits when no dial waited for the cap and it ran its polls
		// (an idle poll is 2 statements on GORM: docs/performance.md, 6).
		r = r.goal(fmt.Sprintf("runs within the cap of %d connections", sz.budget), h.waits == 0 && h.stmtsPerSec >= 0.9*2*expected)
		rows = append(rows, r)
	}
	return rows
}

func (e *tenantEnv) busyRows(lib, solo busyResult) []Row {
	sz := e.sz
	bname := fmt.Sprintf("%d standalone Subscribers on the busy tenants", sz.busy*len(tenantDefs))
	ml, ms := median(lib.rates), median(solo.rates)
	r1 := newRow(fmt.Sprintf("%d busy among %d: catch-up throughput, %d events per tenant x %d definitions (median of %d)", sz.busy, sz.tenants, sz.busyEvents, len(tenantDefs), len(lib.rates)), ml, ms, "ev/s", bname).
		note(lib.note).note(solo.note).note(fmt.Sprintf("rounds: group %s, standalone %s ev/s; no-op handlers; every store on the one shared pool (WithSchema), both sides", fmtRates(lib.rates), fmtRates(solo.rates)))
	r1 = r1.goal(">= 0.9", ml >= 0.9*ms)
	if spread := max(roundSpread(lib.rates), roundSpread(solo.rates)); len(lib.rates) > 1 && spread > 0.1 && (ml >= 0.9*ms) != (ml >= 0.9*ms*(1-spread)) {
		r1 = r1.undecided(">= 0.9", fmt.Sprintf("rounds spread %.0f%%", 100*spread))
	}
	lw, sw := sortedCopy(lib.wake), sortedCopy(solo.wake)
	wnote := fmt.Sprintf("%d single-event appends round robin over the busy tenants, %s apart, each timed to both definitions' handler starts; appends through the tenants' event stores on the shared pool, on both sides", sz.wakeAppends, sz.wakeSpacing)
	rows := []Row{r1, newRow("busy catch-up: connections held, peak", float64(lib.peak), float64(solo.peak), "count", bname).
		note("connections: the subscriber pools' and the LISTEN connection")}
	for _, p := range []float64{50, 99} {
		r := newRow(fmt.Sprintf("%d busy among %d: wake p%g append->handler", sz.busy, sz.tenants, p), percentile(lw, p), percentile(sw, p), "ms", bname).note(wnote)
		if p == 99 {
			r = r.goal("<= 1.5", r.Figure <= 1.5*r.Baseline)
		}
		rows = append(rows, r)
	}
	return rows
}

func fmtRates(v []float64) string {
	s := make([]string, len(v))
	for i, r := range v {
		s[i] = groupThousands(r)
	}
	return strings.Join(s, ", ")
}
