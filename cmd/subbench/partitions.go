package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	var rows []Row
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
		dup := res.duplicates
		r.Duplicates = &dup
		rows = append(rows, r)
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
			note(fmt.Sprintf("handler: the upsert alone; %d events; 2 cores are shared with Postgres; %.2f statements/event (unpartitioned %.2f), by kind: %s", c.events, res.statements, cbase.statements, res.kinds))
		dup := res.duplicates
		r.Duplicates = &dup
		rows = append(rows, r)
	}
	return rows, nil
}

// runPartitionCase catches a fresh subscriber name up over positions
// 1..c.events and checks every event was committed exactly once.
func runPartitionCase(ctx context.Context, b *bench, sc *partitionSchema, c partitionCase, name string) (partitionResult, error) {
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
		if err := tx.Exec(`INSERT INTO partition_projection (event_id, calls) VALUES (?, 1)
			ON CONFLICT (event_id) DO UPDATE SET calls = partition_projection.calls + 1`, ev.ID).Error; err != nil {
			return err
		}
		if c.wait > 0 {
			time.Sleep(time.Duration(c.wait * float64(time.Millisecond)))
		}
		return nil
	}
	var subs []*subscriptions.Subscriber
	for range c.pools {
		db, err := b.openPG(dsn, c.workers+2, kinds)
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
	elapsed, err := runSubscribersUntil(ctx, subs, 2*time.Millisecond, func() (bool, error) {
		k, err := counted()
		return k >= int64(c.events), err
	})
	if err != nil {
		return res, err
	}
	var total int64
	counts := kinds.take()
	for _, v := range counts {
		total += v
	}
	res.kinds = kindsPerEvent(counts, c.events)
	var agg struct {
		Rows  int64
		Calls int64
	}
	if err := setup.Raw("SELECT COUNT(*) AS rows, COALESCE(SUM(calls), 0) AS calls FROM partition_projection").Scan(&agg).Error; err != nil {
		return res, err
	}
	if agg.Rows != int64(c.events) {
		return res, fmt.Errorf("the projection holds %d rows, want %d", agg.Rows, c.events)
	}
	res.rate = float64(c.events) / elapsed.Seconds()
	res.duplicates = agg.Calls - agg.Rows
	res.statements = float64(total) / float64(c.events)
	b.logf("  %s (%d per aggregate): %.0f ev/s, %.2f statements/event: %s", c.label(), c.perAggregate, res.rate, res.statements, res.kinds)
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
	if err := execAll(setup, `CREATE TABLE partition_projection (event_id text NOT NULL PRIMARY KEY, calls integer NOT NULL)`, "ANALYZE"); err != nil {
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
