package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// benchPayload is the payload of every generated event.
type benchPayload struct {
	N    int    `json:"n"`
	Note string `json:"note"`
}

// makeEvents builds count fresh envelopes for one aggregate.
func makeEvents(count, first int) []domain.EventEnvelope[any] {
	evs := make([]domain.EventEnvelope[any], count)
	for i := range evs {
		evs[i] = domain.NewEventEnvelope[any](benchPayload{N: first + i, Note: "subbench"}, "", "bench.happened", 0)
	}
	return evs
}

// fillStore appends n events, per aggregates of chunk events each.
func fillStore(ctx context.Context, store domain.EventStore, n, chunk int) error {
	for done, agg := 0, 0; done < n; agg++ {
		c := min(chunk, n-done)
		if err := store.Append(ctx, fmt.Sprintf("agg-%d", agg), -1, makeEvents(c, done)...); err != nil {
			return fmt.Errorf("fill the event store: %w", err)
		}
		done += c
	}
	return nil
}

// windowHandler is the no-op handler of a window ending at position
// end: it notes the time it sees end and closes done.
func windowHandler(end int64) (handle func(context.Context, domain.EventEnvelope[any]) error, done chan struct{}, last *time.Time) {
	done, last = make(chan struct{}), new(time.Time)
	return func(_ context.Context, ev domain.EventEnvelope[any]) error {
		if ev.Position == end {
			*last = time.Now()
			close(done)
		}
		return nil
	}, done, last
}

func best(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// runCatchupMemory: scenario 1.
func runCatchupMemory(ctx context.Context, b *bench) ([]Row, error) {
	sz := b.sizes()
	n, window := sz.memEvents, sz.memWindow
	store := infrastructure.NewMemoryStore()
	t0 := time.Now()
	if err := fillStore(ctx, store, n, 1000); err != nil {
		return nil, err
	}
	b.logf("appended %d events to a MemoryStore in %s", n, time.Since(t0).Round(time.Millisecond))
	all, err := store.ReadAfter(ctx, 0, 0)
	if err != nil {
		return nil, err
	}
	if len(all) != n {
		return nil, fmt.Errorf("MemoryStore holds %d events, want %d", len(all), n)
	}
	wk := fmt.Sprintf("%dk", window/1000)
	var rows []Row
	for _, batch := range []int{100, 1000} {
		var baseFirst, baseLast, libFirst, libLast []float64
		for rep := range sz.memReps {
			// Each window on its own after a collection: the baseline a
			// plain loop over the window's events calling the same
			// handler, the library a Run from a checkpoint at the
			// window's start. Both windows then do the same work but for
			// their place in the history. (Timed in one Run, a window
			// could hold a collection of the heap the Run had grown and
			// the other not: at batch 1000 on one machine the last window
			// always did, 0.5 to 0.6 of the first; 1.03 with GOGC=off.)
			cps := subscriptions.NewMemoryCheckpointStore()
			rates, base := make([]float64, 2), make([]float64, 2)
			for i, from := range []int{0, n - window} {
				end := int64(from + window)
				handle, _, last := windowHandler(end)
				runtime.GC()
				start := time.Now()
				for _, ev := range all[from:end] {
					_ = handle(ctx, ev)
				}
				base[i] = float64(window) / last.Sub(start).Seconds()

				name := fmt.Sprintf("mem-b%d-%d-%d", batch, rep, i)
				if err := cps.Reset(ctx, name, int64(from)); err != nil {
					return rows, err
				}
				handle, done, last := windowHandler(end)
				sub, err := subscriptions.NewSubscriber(name, store, cps, handle,
					subscriptions.WithBatchSize(batch), subscriptions.WithLogger(b.libLogger()))
				if err != nil {
					return rows, err
				}
				runtime.GC()
				if err := runUntil(ctx, sub, done, func() { start = time.Now() }); err != nil {
					return rows, err
				}
				rates[i] = float64(window) / last.Sub(start).Seconds()
			}
			baseFirst, baseLast = append(baseFirst, base[0]), append(baseLast, base[1])
			libFirst, libLast = append(libFirst, rates[0]), append(libLast, rates[1])
		}
		// Best of the runs: interference from other processes only ever
		// slows a run down, and a window lasts milliseconds.
		bf, bl, lf, ll := best(baseFirst), best(baseLast), best(libFirst), best(libLast)
		base := "a plain loop over the same []EventEnvelope calling the same handler"
		reps := fmt.Sprintf("best of %d runs over %d events (median: library %s / %s ev/s)", sz.memReps, n, groupThousands(median(libFirst)), groupThousands(median(libLast)))
		rows = append(rows,
			newRow(fmt.Sprintf("batch %d: first %s events", batch, wk), lf, bf, "ev/s", base).note(reps),
			newRow(fmt.Sprintf("batch %d: last %s events", batch, wk), ll, bl, "ev/s", base).note(reps),
		)
		r := newRow(fmt.Sprintf("batch %d: last vs first %s", batch, wk), ll, lf, "ev/s", "the library's own rate over the first window")
		rows = append(rows, r.goal(">= 0.8 (no slow-down as history grows)", r.Ratio != nil && *r.Ratio >= 0.8))
	}
	return rows, nil
}

// runUntil runs sub until done is closed (or ctx ends), then stops it and
// waits for Run to return. started runs just before Run starts.
func runUntil(ctx context.Context, sub *subscriptions.Subscriber, done <-chan struct{}, started func()) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	if started != nil {
		started()
	}
	go func() { errc <- sub.Run(rctx) }()
	select {
	case <-done:
		cancel()
		return <-errc
	case err := <-errc:
		if err == nil {
			err = errors.New("Run returned before the catch-up finished")
		}
		return err
	case <-ctx.Done():
		cancel()
		<-errc
		return ctx.Err()
	}
}

// dbContestant is one variant of the Postgres/SQLite catch-up. The
// variants race through the same history at the same time, each with a
// projection table (on SQLite, a database file) of its own.
type dbContestant struct {
	kind  string // "baseline", "library", "library+parking"
	app   string // Postgres: the pool's application_name suffix
	pool  *backendDB
	table string
	// opts are extra subscriber options of a library variant.
	opts []subscriptions.SubscriberOption
	// hand, when set, instruments the baseline's loop by hand (scenario
	// 8's baseline+spans).
	hand    *handTelemetry
	handled atomic.Int64  // events upserted in this race
	elapsed time.Duration // from the start to the last commit
}

var contestantKinds = []string{"baseline", "library", "library+parking"}

// upsert is the projection write: one row per event, through exec (a
// plain transaction's or the batch transaction's).
func (c *dbContestant) upsert(exec execFunc, ev domain.EventEnvelope[any]) error {
	err := exec(`INSERT INTO `+c.table+` (event_id, aggregate_id, position) VALUES (?, ?, ?)
		ON CONFLICT (event_id) DO UPDATE SET aggregate_id = excluded.aggregate_id, position = excluded.position`,
		ev.ID, ev.AggregateID, ev.Position)
	if err == nil {
		c.handled.Add(1)
	}
	return err
}

func (c *dbContestant) prepare(ctx context.Context) error {
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS ` + c.table + ` (event_id text NOT NULL PRIMARY KEY, aggregate_id text NOT NULL, position bigint NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS bench_checkpoint (name text NOT NULL PRIMARY KEY, position bigint NOT NULL, updated_at timestamp)`,
	} {
		if err := c.pool.exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: set up: %w", c.kind, err)
		}
	}
	return nil
}

func (c *dbContestant) clear(ctx context.Context) error {
	c.handled.Store(0)
	if c.pool.engine == "postgres" {
		return c.pool.exec(ctx, "TRUNCATE "+c.table)
	}
	return c.pool.exec(ctx, "DELETE FROM "+c.table)
}

// check verifies exactly-once: one row per event.
func (c *dbContestant) check(ctx context.Context, want int64) error {
	var got int64
	if err := c.pool.scan(ctx, "SELECT COUNT(*) FROM "+c.table, &got); err != nil {
		return fmt.Errorf("%s: count the projection: %w", c.kind, err)
	}
	if got != want {
		return fmt.Errorf("%s: the projection holds %d rows, want %d", c.kind, got, want)
	}
	return nil
}

// label is the contestant's kind, prefixed by its backend but GORM's.
func (c *dbContestant) label() string { return c.pool.backend.label(c.kind) }

func runCatchupPostgres(ctx context.Context, b *bench) ([]Row, error) {
	cs, err := postgresContestants(ctx, b, "catchup", contestantKinds, pgBackends)
	if err != nil {
		return nil, err
	}
	return catchupDB(ctx, b, cs, "each on a pool and a projection table of its own in the same database")
}

// postgresContestants opens one pool, with the backend's stores, and one
// projection table per variant of each backend, on a schema filled with
// the scenario's history.
func postgresContestants(ctx context.Context, b *bench, schema string, kinds []string, backends []*backend) ([]*dbContestant, error) {
	dsn, db, store, err := b.newPGStore(ctx, schema, 2)
	if err != nil {
		return nil, err
	}
	if err := fillDB(ctx, b, db, store); err != nil {
		return nil, err
	}
	var cs []*dbContestant
	for _, be := range backends {
		for _, kind := range kinds {
			// A pool of its own each, as separate processes would have: with a
			// shared pool the variants trade connections, and an A/A run
			// (the same variant twice) showed a steady ~10% bias by position.
			i := len(cs)
			app := fmt.Sprintf("%s%d", schema, i)
			pool, err := be.open(ctx, b, dsn, app, 4, nil)
			if err != nil {
				return nil, err
			}
			cs = append(cs, &dbContestant{kind: kind, app: app, pool: pool, table: fmt.Sprintf("bench_projection_%d", i)})
		}
	}
	return cs, nil
}

func runCatchupSQLite(ctx context.Context, b *bench) ([]Row, error) {
	var cs []*dbContestant
	for i, kind := range contestantKinds {
		db, err := b.openSQLite(fmt.Sprintf("catchup%d", i))
		if err != nil {
			return nil, err
		}
		pool, err := gormBackendDB(db)
		if err != nil {
			return nil, err
		}
		if err := fillDB(ctx, b, db, pool.store); err != nil {
			return nil, err
		}
		cs = append(cs, &dbContestant{kind: kind, pool: pool, table: "bench_projection"})
	}
	return catchupDB(ctx, b, cs, "each on a database file of its own (SQLite has one writer per database), filled alike")
}

func fillDB(ctx context.Context, b *bench, db *gorm.DB, store domain.EventStore) error {
	t0 := time.Now()
	n := b.sizes().dbEvents
	if err := fillStore(ctx, store, n, 1000); err != nil {
		return err
	}
	if err := db.Exec("ANALYZE").Error; err != nil {
		return err
	}
	b.logf("appended %d events on %s in %s", n, db.Name(), time.Since(t0).Round(time.Millisecond))
	return nil
}

// catchupDB: scenarios 2 and 3. For each batch size the baseline and the
// two library variants of each backend catch up on the same history at the
// same time, so that the machine's load (other processes on a shared
// machine) weighs on every variant alike; each rate is taken over the time
// until the first variant finished. A library variant is measured against
// its backend's baseline, and pgx's also against GORM's same variant.
func catchupDB(ctx context.Context, b *bench, cs []*dbContestant, where string) ([]Row, error) {
	n := int64(b.sizes().dbEvents)
	for _, c := range cs {
		if err := c.prepare(ctx); err != nil {
			return nil, err
		}
	}
	var rows []Row
	for _, batch := range []int{100, 1000} {
		for _, c := range cs {
			if err := c.clear(ctx); err != nil {
				return rows, err
			}
		}
		// Open every pool's connections before the start.
		for _, c := range cs {
			if err := c.pool.exec(ctx, "SELECT 1"); err != nil {
				return rows, err
			}
		}
		cpuBefore := make([]map[int]time.Duration, len(cs))
		for i, c := range cs {
			if c.app != "" {
				cpuBefore[i] = b.backendCPU(ctx, c.app)
			}
		}
		start := time.Now()
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			name := c.subscriberName(batch)
			wg.Go(func() {
				if c.kind == "baseline" {
					errs[i] = baselineCatchup(ctx, c, batch, n, name, start)
					return
				}
				opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(batch), subscriptions.WithLogger(b.libLogger())}
				if c.kind == "library+parking" {
					opts = append(opts, subscriptions.WithParkingLot(c.pool.lot))
				}
				errs[i] = libraryCatchup(ctx, c, name, n, opts, start)
			})
		}
		finished := make(chan struct{})
		go func() {
			wg.Wait()
			close(finished)
		}()
		// The race ends when the first variant has handled every event.
		var raceEnd time.Duration
		progress := make([]int64, len(cs))
		serverCPU := make([]string, len(cs))
		tick := time.NewTicker(time.Millisecond)
	race:
		for {
			select {
			case <-tick.C:
			case <-finished:
			}
			for i, c := range cs {
				progress[i] = c.handled.Load()
			}
			if slices.Max(progress) >= n {
				raceEnd = time.Since(start)
				for i, c := range cs {
					if c.app != "" {
						if d, ok := cpuDelta(cpuBefore[i], b.backendCPU(ctx, c.app)); ok && progress[i] > 0 {
							serverCPU[i] = fmt.Sprintf("%s %.0f µs", c.label(), float64(d.Microseconds())/float64(progress[i]))
						}
					}
				}
				break race
			}
			select {
			case <-finished:
				break race
			default:
			}
		}
		tick.Stop()
		<-finished
		if err := errors.Join(errs...); err != nil {
			return rows, fmt.Errorf("batch %d: %w", batch, err)
		}
		if raceEnd == 0 {
			return rows, fmt.Errorf("batch %d: no variant handled all %d events", batch, n)
		}
		for _, c := range cs {
			if err := c.check(ctx, n); err != nil {
				return rows, fmt.Errorf("batch %d: %w", batch, err)
			}
		}
		rate := func(i int) float64 { return float64(progress[i]) / raceEnd.Seconds() }
		finish := make([]string, len(cs))
		for i, c := range cs {
			finish[i] = fmt.Sprintf("%s %s", c.label(), c.elapsed.Round(10*time.Millisecond))
		}
		note := fmt.Sprintf("%d events, one upsert per event through the batch transaction (TxFromContext); every variant ran at the same time, %s; rates over the %s until the first had handled every event (each alone runs faster); all done after: %s",
			n, where, raceEnd.Round(10*time.Millisecond), strings.Join(finish, ", "))
		if serverCPU[0] != "" {
			note += "; Postgres backend CPU per event over the race (from /proc): " + strings.Join(serverCPU, ", ")
		}
		// index finds the contestant of backend be and kind.
		index := func(be *backend, kind string) int {
			return slices.IndexFunc(cs, func(c *dbContestant) bool { return c.pool.backend == be && c.kind == kind })
		}
		for i, c := range cs {
			if c.kind == "baseline" {
				continue
			}
			label := fmt.Sprintf("batch %d, no parking lot", batch)
			if c.kind == "library+parking" {
				label = fmt.Sprintf("batch %d, parking lot", batch)
			}
			be := c.pool.backend
			r := newRow(be.label(label), rate(i), rate(index(be, "baseline")), "ev/s", baselineName(be, batch)).note(note)
			rows = append(rows, r.goal(">= 0.85", r.Ratio != nil && *r.Ratio >= 0.85))
			if g := index(gormBackend, c.kind); be != gormBackend && g >= 0 {
				rows = append(rows, newRow(be.label(label+" vs GORM"), rate(i), rate(g), "ev/s", "GORM's same variant in the same race").note(note))
			}
		}
	}
	return rows, nil
}

// baselineName says what the catch-up baseline of backend be does.
func baselineName(be *backend, batch int) string {
	how := "the same reads (GormEventStore.ReadAfter) and upserts (same GORM tx.Exec)"
	if be == pgxBackend {
		how = "the same reads (pgxstore.EventStore.ReadAfter) and upserts (same pgx tx.Exec)"
	}
	return fmt.Sprintf("%s in plain transactions of %d events, each with a checkpoint UPDATE, no library", how, batch)
}

// subscriberName is the contestant's subscriber (or the baseline's
// checkpoint) name for a race of batch: the backends' variants race on
// one database, each under a name of its own.
func (c *dbContestant) subscriberName(batch int) string {
	name := fmt.Sprintf("%s-b%d", c.kind, batch)
	if be := c.pool.backend; be != gormBackend {
		name = be.name + "-" + name
	}
	return name
}

// baselineCatchup does what a subscriber does, by hand, without the
// library: read a batch, upsert each event and advance a checkpoint in one
// plain transaction.
func baselineCatchup(ctx context.Context, c *dbContestant, batch int, head int64, name string, start time.Time) error {
	if err := c.pool.exec(ctx, `INSERT INTO bench_checkpoint (name, position, updated_at) VALUES (?, 0, ?)
		ON CONFLICT (name) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at`, name, time.Now().UTC()); err != nil {
		return fmt.Errorf("%s: create the checkpoint: %w", name, err)
	}
	var pos int64
	for pos < head {
		events, err := c.pool.store.ReadAfter(ctx, pos, batch)
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return fmt.Errorf("the feed ended at %d before the head %d", pos, head)
		}
		last := events[len(events)-1].Position
		// The transaction runs on a context without cancellation, as the
		// library's batches do (context.WithoutCancel): with a cancellable
		// one, database/sql watches it per transaction and go-sqlite3 runs
		// every statement on a goroutine of its own, which would handicap
		// the baseline.
		if c.hand != nil {
			err = c.handBatch(ctx, events, last, name)
		} else {
			err = c.pool.inTx(context.WithoutCancel(ctx), func(exec execFunc) error {
				for _, ev := range events {
					if err := c.upsert(exec, ev); err != nil {
						return err
					}
				}
				return exec("UPDATE bench_checkpoint SET position = ?, updated_at = ? WHERE name = ?", last, time.Now().UTC(), name)
			})
		}
		if err != nil {
			return err
		}
		pos = last
	}
	c.elapsed = time.Since(start)
	return nil
}

// handBatch is the baseline's batch transaction instrumented by hand
// (c.hand): the same statements under a batch span and a span per upsert.
func (c *dbContestant) handBatch(ctx context.Context, events []domain.EventEnvelope[any], last int64, name string) error {
	bctx, end := c.hand.batch(context.WithoutCancel(ctx), events)
	err := c.pool.inTx(bctx, func(exec execFunc) error {
		for _, ev := range events {
			if err := c.hand.handle(bctx, ev, func() error { return c.upsert(exec, ev) }); err != nil {
				return err
			}
		}
		return exec("UPDATE bench_checkpoint SET position = ?, updated_at = ? WHERE name = ?", last, time.Now().UTC(), name)
	})
	end(err)
	return err
}

// libraryCatchup runs a subscriber (its checkpoint reset to 0) until its
// checkpoint reaches head.
func libraryCatchup(ctx context.Context, c *dbContestant, name string, head int64, opts []subscriptions.SubscriberOption, start time.Time) error {
	if err := c.pool.cps.Reset(ctx, name, 0); err != nil {
		return err
	}
	seen := make(chan struct{})
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		exec := c.pool.batchExec(ctx)
		if exec == nil {
			return errors.New("no batch transaction in the handler's context")
		}
		if err := c.upsert(exec, ev); err != nil {
			return err
		}
		if ev.Position == head {
			select {
			case <-seen:
			default:
				close(seen)
			}
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber(name, c.pool.store, c.pool.cps, handler, opts...)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- sub.Run(rctx) }()
	stop := func(err error) error {
		cancel()
		return errors.Join(err, <-errc)
	}
	// A watchdog: a catch-up that stops making progress is an error (with
	// where it stopped), never a hang.
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	lastPos, lastMove := int64(-1), time.Now()
wait:
	for {
		select {
		case <-seen:
			break wait
		case err := <-errc:
			return fmt.Errorf("Run returned early: %v", err)
		case <-ctx.Done():
			return stop(ctx.Err())
		case <-tick.C:
			pos, err := c.pool.cps.Position(ctx, name)
			if err == nil && pos != lastPos {
				lastPos, lastMove = pos, time.Now()
			}
			if time.Since(lastMove) > 30*time.Second {
				return stop(fmt.Errorf("%s: no progress for 30s: checkpoint at %d (last read error: %v), head %d", name, pos, err, head))
			}
		}
	}
	// The last event was handled; wait for its batch to commit.
	for {
		pos, err := c.pool.cps.Position(ctx, name)
		if err != nil {
			return stop(err)
		}
		if pos >= head {
			c.elapsed = time.Since(start)
			break
		}
		if time.Since(lastMove) > time.Minute {
			return stop(fmt.Errorf("%s: the last event was handled but the checkpoint stays at %d < %d", name, pos, head))
		}
		time.Sleep(200 * time.Microsecond)
	}
	return stop(nil)
}

// cappedStore shows the feed only up to max: it lets one catch-up run
// over a slice of the history and go idle at its end.
type cappedStore struct {
	domain.EventStore
	max int64
}

func (c *cappedStore) ReadAfter(ctx context.Context, after int64, limit int) ([]domain.EventEnvelope[any], error) {
	events, err := c.EventStore.ReadAfter(ctx, after, limit)
	for len(events) > 0 && events[len(events)-1].Position > c.max {
		events = events[:len(events)-1]
	}
	return events, err
}

func (c *cappedStore) HeadPosition(ctx context.Context) (int64, error) {
	head, err := c.EventStore.HeadPosition(ctx)
	return min(head, c.max), err
}

// cutSlices splits positions 1..n into k consecutive ranges (from, to].
func cutSlices(n int64, k int) [][2]int64 {
	out := make([][2]int64, k)
	for i := range k {
		out[i] = [2]int64{n * int64(i) / int64(k), n * int64(i+1) / int64(k)}
	}
	return out
}
