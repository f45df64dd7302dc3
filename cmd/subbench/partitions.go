package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// partitionCase is one run of the "partitions" scenario: a subscriber with
// n partitions (0: unpartitioned) over pools processes (pools standing in
// for processes), k workers each.
type partitionCase struct {
	partitions, pools, workers int
	events                     int     // caught up over positions 1..events
	wait                       float64 // handler sleep, ms
	perAggregate               int     // events per aggregate in the schema (20, or 2 for the added rows)
}

func (c partitionCase) label() string {
	if c.partitions == 0 {
		return "unpartitioned"
	}
	return fmt.Sprintf("%d partitions, %d pool(s) x %d worker(s)", c.partitions, c.pools, c.workers)
}

// partitionResult is one case's outcome.
type partitionResult struct {
	rate       float64 // events/s
	duplicates int64   // committed writes beyond one per event
	statements float64 // per event, every pool together
	kinds      string  // statements per event by kind (the main ones)
	clientCPU  float64 // this process's CPU (getrusage) per event, µs
	serverCPU  float64 // the pools' backends' CPU (/proc) per event, µs; 0 unknown
}

// cpu is the CPU note of a result: client and server µs per event.
func (r partitionResult) cpu() string {
	server := "server unknown"
	if r.serverCPU > 0 {
		server = fmt.Sprintf("server %.0f", r.serverCPU)
	}
	return fmt.Sprintf("CPU per event: client %.0f µs, %s µs", r.clientCPU, server)
}

// runPartitions: scenario 9. A handler that upserts through TxFromContext
// and then waits 2 ms (I/O-bound) on 1, 4 and 16 partitions, over 1 and 4
// pools; baseline: n times the unpartitioned rate of the same run. Then the
// CPU-bound handler (the upsert alone), whose figure 2 cores cap.
func runPartitions(ctx context.Context, b *bench) ([]Row, error) {
	sz := b.sizes()
	n := sz.partitionEvents
	// Two schemas: the full feed, and a shorter one for the slow cases
	// (one event at a time, ~2 ms each), whose rate is steady long before.
	slow := min(n, sz.partitionSlow)
	full, err := newPartitionSchema(ctx, b, "partitions", n)
	if err != nil {
		return nil, err
	}
	short, err := newPartitionSchema(ctx, b, "partitions_short", slow)
	if err != nil {
		return nil, err
	}
	// Added rows: the same events over 10,000 aggregates of 2, so that the
	// hash spreads the events evenly and the largest partition's excess
	// (skew) no longer caps the ratio: what is left is overhead.
	many, err := newPartitionSchemaOf(ctx, b, "partitions_many", n, 2)
	if err != nil {
		return nil, err
	}

	io := func(p, pools, workers, events int) partitionCase {
		return partitionCase{partitions: p, pools: pools, workers: workers, events: events, wait: 2, perAggregate: 20}
	}
	schema := func(c partitionCase) *partitionSchema {
		switch {
		case c.perAggregate == 2:
			return many
		case c.events < n:
			return short
		}
		return full
	}
	base, err := runPartitionCase(ctx, b, short, io(0, 1, 1, slow), "io-base")
	if err != nil {
		return nil, err
	}
	bname := "n x the unpartitioned rate (same handler, this run)"
	note := fmt.Sprintf("handler: one upsert through TxFromContext, then a 2 ms sleep; batch 100; events of %d aggregates of 20; unpartitioned rate %.0f ev/s over %d events (%.2f statements/event: %s)",
		n/20, base.rate, slow, base.statements, base.kinds)
	// The machine's ceiling: plain workers without the library, the
	// single one over the short feed as the unpartitioned baseline is.
	plainOne, err := runPlainPartitions(ctx, b, short, io(1, 1, 1, slow), "plain-1")
	if err != nil {
		return nil, fmt.Errorf("plain single worker: %w", err)
	}
	plain := map[int]partitionResult{}
	for _, k := range []int{4, 16} {
		if plain[k], err = runPlainPartitions(ctx, b, full, io(k, 1, k, n), fmt.Sprintf("plain-%d", k)); err != nil {
			return nil, fmt.Errorf("plain %d workers: %w", k, err)
		}
	}
	var rows []Row
	lib := map[string]float64{} // library rates by case label, for the ceiling rows
	ioMany := func(p, pools, workers int) partitionCase {
		c := io(p, pools, workers, n)
		c.perAggregate = 2
		return c
	}
	for _, c := range []partitionCase{io(1, 1, 1, slow), io(4, 1, 4, n), io(16, 1, 16, n), io(1, 4, 1, slow), io(4, 4, 1, n), io(16, 4, 4, n), ioMany(16, 1, 16), ioMany(16, 4, 4)} {
		res, err := runPartitionCase(ctx, b, schema(c), c, fmt.Sprintf("io-%d-%d-%d", c.partitions, c.pools, c.perAggregate))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.label(), err)
		}
		want := float64(c.partitions) * base.rate
		label := "I/O-bound, " + c.label()
		if c.perAggregate == 2 {
			label += fmt.Sprintf(", added: %d aggregates of 2 events", c.events/2)
		}
		skew := partitionSkew(c.events, c.partitions, c.perAggregate)
		r := newRow(label, res.rate, want, "ev/s", bname).
			goal(">= 0.8", res.rate >= 0.8*want).
			note(fmt.Sprintf("%d events of %d aggregates; %.2f statements/event (unpartitioned %.2f), by kind: %s; the largest partition holds %.2f x the mean, so the slowest partition caps the ratio near %.2f",
				c.events, c.events/c.perAggregate, res.statements, base.statements, res.kinds, skew, 1/skew))
		if len(rows) == 0 {
			r = r.note(note)
		}
		r = r.note(res.cpu() + fmt.Sprintf(" (unpartitioned: client %.0f, server %.0f)", base.clientCPU, base.serverCPU))
		dup := res.duplicates
		r.Duplicates = &dup
		rows = append(rows, r)
		if c.perAggregate == 20 {
			lib[c.label()] = res.rate
		}
	}
	plainName := "plain Go code without the library: n goroutines, each owning its partition's events (read before the start), the same upsert and 2 ms sleep, transactions of 100 events with a checkpoint UPDATE"
	for _, k := range []int{4, 16} {
		pl := plain[k]
		rows = append(rows, newRow(fmt.Sprintf("machine ceiling: plain %d workers vs %d x plain single", k, k), pl.rate, float64(k)*plainOne.rate, "ev/s",
			fmt.Sprintf("%d x the plain single worker's rate (%.0f ev/s over %d events, this run)", k, plainOne.rate, slow)).
			note(fmt.Sprintf("%s; %d events of %d aggregates; %.2f statements/event; %s (plain single: %s)", plainName, n, n/20, pl.statements, pl.cpu(), plainOne.cpu())))
		for _, pools := range []int{1, 4} {
			label := io(k, pools, k/pools, n).label()
			if v, ok := lib[label]; ok {
				rows = append(rows, newRow(fmt.Sprintf("I/O-bound, %s, vs plain %d workers", label, k), v, pl.rate, "ev/s", "the plain n-worker rate of this run (row above)"))
			}
		}
	}

	cpu := func(p, pools, workers int) partitionCase {
		return partitionCase{partitions: p, pools: pools, workers: workers, events: n, perAggregate: 20}
	}
	cbase, err := runPartitionCase(ctx, b, full, cpu(0, 1, 1), "cpu-base")
	if err != nil {
		return nil, err
	}
	for _, c := range []partitionCase{cpu(4, 1, 4), cpu(16, 4, 4)} {
		res, err := runPartitionCase(ctx, b, full, c, fmt.Sprintf("cpu-%d-%d", c.partitions, c.pools))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.label(), err)
		}
		r := newRow("CPU-bound, "+c.label(), res.rate, cbase.rate, "ev/s", "one unpartitioned subscriber, same handler").
			note(fmt.Sprintf("handler: the upsert alone; %d events; 2 cores are shared with Postgres; %.2f statements/event (unpartitioned %.2f), by kind: %s; %s (unpartitioned: client %.0f, server %.0f)", c.events, res.statements, cbase.statements, res.kinds, res.cpu(), cbase.clientCPU, cbase.serverCPU))
		dup := res.duplicates
		r.Duplicates = &dup
		rows = append(rows, r)
	}
	return rows, nil
}

// runPartitionCase catches a fresh subscriber name up over positions
// 1..c.events and checks every event was committed exactly once.
func runPartitionCase(ctx context.Context, b *bench, sc *partitionSchema, c partitionCase, name string) (partitionResult, error) {
	defer b.casePools()()
	var res partitionResult
	dsn, setup := sc.dsn, sc.setup
	if err := setup.Exec("TRUNCATE partition_projection").Error; err != nil {
		return res, err
	}
	kinds := &kindCounter{}
	// attempts gates the exact check below: counting the projection's rows
	// every 2 ms from the start would cost Postgres CPU throughout, which
	// the fast cases (16 partitions, CPU-bound) pay more for than the
	// unpartitioned baseline; so the count runs once the handlers have
	// been called for every event.
	var attempts atomic.Int64
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		attempts.Add(1)
		tx := subscriptions.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no batch transaction")
		}
		return c.handle(tx, ev)
	}
	var subs []*subscriptions.Subscriber
	for range c.pools {
		db, err := b.openPGAs(dsn, "parts-"+name, c.workers+2, kinds)
		if err != nil {
			return res, err
		}
		store, err := infrastructure.NewGormEventStore(db)
		if err != nil {
			return res, err
		}
		cps, err := subscriptions.NewGormCheckpointStore(db)
		if err != nil {
			return res, err
		}
		opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(100), subscriptions.WithPollInterval(100 * time.Millisecond), subscriptions.WithLogger(b.libLogger())}
		if c.partitions > 0 {
			opts = append(opts, subscriptions.WithPartitions(c.partitions), subscriptions.WithConcurrency(c.workers))
		}
		sub, err := subscriptions.NewSubscriber("parts-"+name, store, cps, handler, opts...)
		if err != nil {
			return res, err
		}
		subs = append(subs, sub)
	}
	counted := func() (int64, error) {
		if attempts.Load() < int64(c.events) {
			return 0, nil
		}
		var k int64
		err := setup.Raw("SELECT COUNT(*) FROM partition_projection").Scan(&k).Error
		return k, err
	}
	kinds.take()
	cpu0, server0 := processCPU(), b.backendCPU(ctx, "parts-"+name)
	elapsed, err := runSubscribersUntil(ctx, subs, 2*time.Millisecond, func() (bool, error) {
		k, err := counted()
		return k >= int64(c.events), err
	})
	if err != nil {
		return res, err
	}
	res.measureCPU(ctx, b, "parts-"+name, c.events, cpu0, server0)
	if err := res.finish(setup, kinds, c.events, elapsed); err != nil {
		return res, err
	}
	b.logf("  %s (%d per aggregate): %.0f ev/s, %.2f statements/event: %s; %s", c.label(), c.perAggregate, res.rate, res.statements, res.kinds, res.cpu())
	return res, nil
}

// handle is the case's handler on tx: the upsert, then the I/O wait.
// The library's handler and the plain workers share it.
func (c partitionCase) handle(tx *gorm.DB, ev domain.EventEnvelope[any]) error {
	if err := tx.Exec(`INSERT INTO partition_projection (event_id, calls) VALUES (?, 1)
		ON CONFLICT (event_id) DO UPDATE SET calls = partition_projection.calls + 1`, ev.ID).Error; err != nil {
		return err
	}
	if c.wait > 0 {
		time.Sleep(time.Duration(c.wait * float64(time.Millisecond)))
	}
	return nil
}

// finish checks that the projection holds one row per event (setup is
// the scenario's own connection) and sets the rate over elapsed, the
// writes beyond one per event, and the statements per event counted by
// kinds since its last take.
func (r *partitionResult) finish(setup *gorm.DB, kinds *kindCounter, events int, elapsed time.Duration) error {
	var agg struct {
		Rows  int64
		Calls int64
	}
	if err := setup.Raw("SELECT COUNT(*) AS rows, COALESCE(SUM(calls), 0) AS calls FROM partition_projection").Scan(&agg).Error; err != nil {
		return err
	}
	if agg.Rows != int64(events) {
		return fmt.Errorf("the projection holds %d rows, want %d", agg.Rows, events)
	}
	var total int64
	counts := kinds.take()
	for _, v := range counts {
		total += v
	}
	r.kinds = kindsPerEvent(counts, events)
	r.rate = float64(events) / elapsed.Seconds()
	r.duplicates = agg.Calls - agg.Rows
	r.statements = float64(total) / float64(events)
	return nil
}

// measureCPU sets the result's CPU per event since cpu0 (this process)
// and server0 (the backends of the pools named app).
func (r *partitionResult) measureCPU(ctx context.Context, b *bench, app string, events int, cpu0 time.Duration, server0 map[int]time.Duration) {
	r.clientCPU = float64((processCPU() - cpu0).Microseconds()) / float64(events)
	if d, ok := cpuDelta(server0, b.backendCPU(ctx, app)); ok {
		r.serverCPU = float64(d.Microseconds()) / float64(events)
	}
}

// runPlainPartitions is the machine's ceiling for a case: plain Go code
// without the library, c.partitions goroutines (1: the plain single
// worker), each owning the events of its partition (PartitionOf), read
// before the clock starts, handling them in transactions of 100 events
// (the case's handler, then a checkpoint UPDATE of its own row), all on
// one pool of c.partitions+2 connections.
func runPlainPartitions(ctx context.Context, b *bench, sc *partitionSchema, c partitionCase, name string) (partitionResult, error) {
	defer b.casePools()()
	var res partitionResult
	n := max(c.partitions, 1)
	if err := execAll(sc.setup, "TRUNCATE partition_projection", "TRUNCATE partition_plain_checkpoint"); err != nil {
		return res, err
	}
	kinds := &kindCounter{}
	app := "plain-" + name
	db, err := b.openPGAs(sc.dsn, app, n+2, kinds)
	if err != nil {
		return res, err
	}
	store, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return res, err
	}
	owned := make([][]domain.EventEnvelope[any], n)
	for pos := int64(0); pos < int64(c.events); {
		events, err := store.ReadAfter(ctx, pos, 1000)
		if err != nil {
			return res, err
		}
		if len(events) == 0 {
			return res, fmt.Errorf("the feed ended at %d before %d", pos, c.events)
		}
		for _, ev := range events {
			if ev.Position <= int64(c.events) {
				p := subscriptions.PartitionOf(ev.AggregateID, n)
				owned[p] = append(owned[p], ev)
			}
		}
		pos = events[len(events)-1].Position
	}
	for p := range n {
		if err := db.Exec(`INSERT INTO partition_plain_checkpoint (name, position, updated_at) VALUES (?, 0, ?)`,
			fmt.Sprintf("%s-%d", name, p), time.Now().UTC()).Error; err != nil {
			return res, err
		}
	}
	kinds.take()
	cpu0, server0 := processCPU(), b.backendCPU(ctx, app)
	start := time.Now()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p, events := range owned {
		wg.Go(func() {
			tdb := db.WithContext(context.WithoutCancel(ctx))
			for batch := range slices.Chunk(events, 100) {
				last := batch[len(batch)-1].Position
				errs[p] = tdb.Transaction(func(tx *gorm.DB) error {
					for _, ev := range batch {
						if err := c.handle(tx, ev); err != nil {
							return err
						}
					}
					return tx.Exec("UPDATE partition_plain_checkpoint SET position = ?, updated_at = ? WHERE name = ?",
						last, time.Now().UTC(), fmt.Sprintf("%s-%d", name, p)).Error
				})
				if errs[p] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.measureCPU(ctx, b, app, c.events, cpu0, server0)
	if err := res.finish(sc.setup, kinds, c.events, elapsed); err != nil {
		return res, err
	}
	b.logf("  plain, %d worker(s): %.0f ev/s, %.2f statements/event; %s", n, res.rate, res.statements, res.cpu())
	return res, nil
}

// partitionSchema is a schema filled with the scenario's events and its
// projection table.
type partitionSchema struct {
	dsn   string
	setup *gorm.DB
}

func newPartitionSchema(ctx context.Context, b *bench, name string, events int) (*partitionSchema, error) {
	// 20 events per aggregate: enough aggregates to spread over 16
	// partitions, and per-aggregate order still exercised.
	return newPartitionSchemaOf(ctx, b, name, events, 20)
}

// newPartitionSchemaOf is newPartitionSchema with perAggregate events per
// aggregate.
func newPartitionSchemaOf(ctx context.Context, b *bench, name string, events, perAggregate int) (*partitionSchema, error) {
	dsn, setup, store, err := b.newPGStore(ctx, name, 4)
	if err != nil {
		return nil, err
	}
	if err := fillStore(ctx, store, events, perAggregate); err != nil {
		return nil, err
	}
	if err := execAll(setup, `CREATE TABLE partition_projection (event_id text NOT NULL PRIMARY KEY, calls integer NOT NULL)`,
		`CREATE TABLE partition_plain_checkpoint (name text NOT NULL PRIMARY KEY, position bigint NOT NULL, updated_at timestamp)`, "ANALYZE"); err != nil {
		return nil, err
	}
	if _, err := subscriptions.NewGormCheckpointStore(setup); err != nil {
		return nil, err
	}
	return &partitionSchema{dsn: dsn, setup: setup}, nil
}

// partitionSkew is the largest partition's size over the mean for the
// events fillStore(events, perAggregate) appends: the hash spreads
// aggregates, not events, and a catch-up ends when the largest partition
// does.
func partitionSkew(events, partitions, perAggregate int) float64 {
	sizes := make([]int, partitions)
	for done, agg := 0, 0; done < events; agg++ {
		c := min(perAggregate, events-done)
		sizes[subscriptions.PartitionOf(fmt.Sprintf("agg-%d", agg), partitions)] += c
		done += c
	}
	return float64(slices.Max(sizes)) * float64(partitions) / float64(events)
}

// kindsPerEvent lists the statement kinds of counts (statementKind) that
// reach 0.005 per event, most frequent first, as "kind n/event".
func kindsPerEvent(counts map[string]int64, events int) string {
	type kv struct {
		kind string
		n    int64
	}
	var list []kv
	for k, n := range counts {
		if float64(n)/float64(events) >= 0.005 {
			list = append(list, kv{k, n})
		}
	}
	slices.SortFunc(list, func(a, b kv) int { return cmp.Compare(b.n, a.n) })
	parts := make([]string, len(list))
	for i, e := range list {
		parts[i] = fmt.Sprintf("%s %.3f", e.kind, float64(e.n)/float64(events))
	}
	return strings.Join(parts, ", ")
}
