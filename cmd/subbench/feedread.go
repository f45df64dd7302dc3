package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
)

// The feed read (scenario 14): a
// catch-up whose handler does nothing, so that what is measured is the
// library's read path (acquire, read, decode, hand over, commit), next to
// a raw reader of the same rows written by hand with pgx. The variants
// run one at a time, on pools of their own, in an order that rotates
// each round; each figure is the median of the rounds.

// feedReadSelect is the raw reader's query: the columns of the events
// table a reader needs, in the order rawRow scans them.
const feedReadSelect = `SELECT id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at
	FROM events WHERE position > $1 ORDER BY position LIMIT $2`

// rawReadBatch reads one batch with the raw reader's statement on tx and
// decodes it as a reader would by hand, and as the library does:
// encoding/json into any (objects as map[string]any), metadata never nil
// ({} taken as an empty map without encoding/json, as the library takes
// it), Created in UTC. It scans as a new user would, into fresh []byte.
func rawReadBatch(ctx context.Context, tx pgx.Tx, after int64, limit int) ([]domain.EventEnvelope[any], error) {
	rows, err := tx.Query(ctx, feedReadSelect, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	events := make([]domain.EventEnvelope[any], 0, limit)
	for rows.Next() {
		var (
			ev                domain.EventEnvelope[any]
			payload, metadata []byte
			created           time.Time
		)
		if err := rows.Scan(&ev.ID, &ev.AggregateID, &ev.EventType, &ev.SequenceNo, &ev.TransactionID, &ev.Position, &payload, &metadata, &created); err != nil {
			return nil, err
		}
		if len(payload) > 0 {
			if err := json.Unmarshal(payload, &ev.Payload); err != nil {
				return nil, fmt.Errorf("event %s: payload: %w", ev.ID, err)
			}
		}
		// Metadata is mostly {}, which the library decodes without
		// encoding/json: so does this reader, for the same decoding.
		var meta map[string]any
		if len(metadata) > 0 && string(metadata) != "{}" {
			if err := json.Unmarshal(metadata, &meta); err != nil {
				return nil, fmt.Errorf("event %s: metadata: %w", ev.ID, err)
			}
		}
		if meta == nil {
			meta = map[string]any{}
		}
		ev.Metadata, ev.Created = meta, created.UTC()
		events = append(events, ev)
	}
	return events, rows.Err()
}

// rawReader is the baseline: on one connection, a transaction per batch
// that reads the batch (rawReadBatch), hands it to handle and moves a
// checkpoint row with an UPDATE. It stops at head.
func rawReader(ctx context.Context, pool *pgxpool.Pool, name string, batch int, head int64, handle func([]domain.EventEnvelope[any])) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `INSERT INTO bench_checkpoint (name, position, updated_at) VALUES ($1, 0, $2)
		ON CONFLICT (name) DO UPDATE SET position = 0, updated_at = excluded.updated_at`, name, time.Now().UTC()); err != nil {
		return fmt.Errorf("raw reader: create the checkpoint: %w", err)
	}
	var pos int64
	for pos < head {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			events, err := rawReadBatch(ctx, tx, pos, batch)
			if err != nil {
				return err
			}
			if len(events) == 0 {
				return fmt.Errorf("the feed ended at %d before the head %d", pos, head)
			}
			handle(events)
			last := events[len(events)-1].Position
			if _, err := tx.Exec(ctx, "UPDATE bench_checkpoint SET position = $1, updated_at = $2 WHERE name = $3", last, time.Now().UTC(), name); err != nil {
				return err
			}
			pos = last
			return nil
		})
		if err != nil {
			return fmt.Errorf("raw reader: %w", err)
		}
	}
	return nil
}

// feedVariant is one contestant of the feed read.
type feedVariant struct {
	label string
	be    *backend      // nil: the raw reader
	batch bool          // the library with a (no-op) batch handler
	db    *backendDB    // the library's pool and stores
	raw   *pgxpool.Pool // the raw reader's pool
	app   string
	trips *tripCounter
}

// feedMeasure is one run of a variant.
type feedMeasure struct {
	// wall is the steady span, over events events; startup the time to
	// the first batch.
	wall, startup  time.Duration
	events         int64
	cpu, server    time.Duration
	mallocs, bytes uint64
	trips, stmts   int64
	batches        int64
}

// rate is the steady catch-up rate of the run, in events per second.
func (m feedMeasure) rate() float64 { return float64(m.events) / m.wall.Seconds() }

// tripCounter counts round trips and statements at the driver: a Query
// or an Exec is one of each; a pipeline (pgx.Batch) is one round trip for
// all its statements.
type tripCounter struct {
	trips, stmts atomic.Int64
}

func (t *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.trips.Add(1)
	t.stmts.Add(1)
	return ctx
}
func (t *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.trips.Add(1)
	return ctx
}
func (t *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	t.stmts.Add(1)
}
func (t *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

var (
	_ pgx.QueryTracer = (*tripCounter)(nil)
	_ pgx.BatchTracer = (*tripCounter)(nil)
)

// feedReadRounds is the number of rounds of the feed read.
func (b *bench) feedReadRounds() int {
	if b.cfg.Quick {
		return 1
	}
	return 11
}

// runFeedRead: scenario 14.
func runFeedRead(ctx context.Context, b *bench) ([]Row, error) {
	n := b.sizes().feedEvents
	dsn, db, store, err := b.newPGStore(ctx, "feedread", 2)
	if err != nil {
		return nil, err
	}
	if err := fillStore(ctx, store, n, 1000); err != nil {
		return nil, err
	}
	if err := execAll(db,
		`CREATE TABLE bench_checkpoint (name text NOT NULL PRIMARY KEY, position bigint NOT NULL, updated_at timestamp)`,
		`ANALYZE`); err != nil {
		return nil, err
	}
	head := int64(n)
	variants := []*feedVariant{{label: "raw reader"}}
	for _, be := range pgBackends {
		for _, batch := range []bool{false, true} {
			label := "no-op handler"
			if batch {
				label = "no-op batch handler"
			}
			variants = append(variants, &feedVariant{label: be.label(label), be: be, batch: batch})
		}
	}
	for i, v := range variants {
		v.app = fmt.Sprintf("feed%d", i)
		v.trips = &tripCounter{}
		if v.be == nil {
			if v.raw, err = b.openPgxPool(ctx, dsn, v.app, 1, v.trips); err != nil {
				return nil, err
			}
			continue
		}
		// A pool as a new user would size it for one subscriber: the
		// batch's connection and one for the attempt records.
		if v.db, err = v.be.open(ctx, b, dsn, v.app, 2, v.trips); err != nil {
			return nil, err
		}
	}
	decode := decodeCost(ctx, variants[0].raw)

	var rows []Row
	for _, batch := range []int{100, 1000} {
		// runs[i] are variant i's runs; raw[i] are the raw reader's runs
		// paired with them, ratios[i] the pairs' ratios.
		runs := make([][]feedMeasure, len(variants))
		raw := make([][]feedMeasure, len(variants))
		ratios := make([][]float64, len(variants))
		for round := range b.feedReadRounds() {
			for k := range len(variants) - 1 {
				i := 1 + (k+round)%(len(variants)-1)
				pair := []int{0, i}
				if (round+k)%2 == 1 {
					pair = []int{i, 0}
				}
				var got [2]feedMeasure
				for j, vi := range pair {
					v := variants[vi]
					name := fmt.Sprintf("feed-%s-b%d-r%d-%d", v.app, batch, round, i)
					m, err := v.run(ctx, b, name, batch, head)
					if err != nil {
						return rows, fmt.Errorf("batch %d, %s: %w", batch, v.label, err)
					}
					got[j] = m
				}
				if pair[0] != 0 {
					got[0], got[1] = got[1], got[0]
				}
				raw[i] = append(raw[i], got[0])
				runs[i] = append(runs[i], got[1])
				ratios[i] = append(ratios[i], got[1].rate()/got[0].rate())
			}
		}
		var allRaw []feedMeasure
		for i := 1; i < len(variants); i++ {
			allRaw = append(allRaw, raw[i]...)
		}
		rate := func(ms []feedMeasure) float64 {
			v := make([]float64, len(ms))
			for k, m := range ms {
				v[k] = m.rate()
			}
			return median(v)
		}
		breakdown := []string{variants[0].label + ": " + feedBreakdown(allRaw, n)}
		for i := 1; i < len(variants); i++ {
			breakdown = append(breakdown, variants[i].label+": "+feedBreakdown(runs[i], n))
		}
		note := fmt.Sprintf("batch %d, where the time goes (medians of %d runs of %d events each: the time to the first batch; then per event the wall time of the steady catch-up after it, which the rates are, and over the whole run the CPU of this process (client) and of the pool's Postgres backends (server, in 10 ms ticks), allocations; round trips and statements per batch): %s; of which decoding alone (the library's rows to envelopes, in-process) %s",
			batch, b.feedReadRounds(), n, strings.Join(breakdown, "; "), decode)
		bname := fmt.Sprintf("a raw reader: pgx, SELECT ... WHERE position > $1 ORDER BY position LIMIT %d scanned into fresh values, the library's JSON decoding (encoding/json, {} as an empty map) into the same envelopes, a checkpoint UPDATE, one transaction per batch, no library; run just before or after each run of the variant", batch)
		for i, v := range variants {
			if v.be == nil {
				continue
			}
			label := fmt.Sprintf("%s, batch %d", v.label, batch)
			r := newRow(label, rate(runs[i]), rate(raw[i]), "ev/s", bname)
			if i == 1 {
				r = r.note(note)
			}
			pairs := median(ratios[i])
			bestRate := func(ms []feedMeasure) float64 {
				v := make([]float64, len(ms))
				for k, m := range ms {
					v[k] = m.rate()
				}
				return best(v)
			}
			r = r.note(fmt.Sprintf("%s: ratio of each pair of runs %s (median %.3f); best runs %s vs %s ev/s (%.3f)", label, formatRatios(ratios[i]), pairs,
				groupThousands(bestRate(runs[i])), groupThousands(bestRate(raw[i])), bestRate(runs[i])/bestRate(raw[i])))
			rows = append(rows, pairedGoal(r, ratios[i], 0.95))
		}
	}
	b.note("feed read: a library batch is one round trip for BEGIN, the checkpoint row's lock, the attempt record's read and the feed read (pipelined), then the checkpoint UPDATE and the COMMIT: 3 round trips and 6 statements where the raw reader takes 4 and 4 (its BEGIN on its own); the library scans rows into buffers it reuses, the raw reader into fresh values; its startup adds the checkpoint row, the partition-count read and the first batch's attempt record, committed on its own (see the startup figures)")
	b.note("feed read: each variant runs alone, on a pool of its own (the library's: 2 connections, as for one subscriber), in pairs with a run of the raw reader (either first), the variants in an order rotating each round; figure and baseline are the medians of the variant's runs and of the raw runs paired with them")
	return rows, nil
}

// pairedGoal attaches the goal ratio >= goal to r, whose figure and
// baseline are the medians of runs made in pairs whose ratios are pairs:
// met or missed when the ratio of the medians and the median of the
// pairs' ratios agree, undecided when they do not (the noise of the
// rounds straddles the goal).
func pairedGoal(r Row, pairs []float64, goal float64) Row {
	text := ">= " + strconv.FormatFloat(goal, 'f', -1, 64)
	met := r.Ratio != nil && *r.Ratio >= goal
	if met != (median(pairs) >= goal) {
		return r.undecided(text, "undecided: the ratio of the medians and the median of the pairs' ratios disagree")
	}
	return r.goal(text, met)
}

func formatRatios(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(s, " ")
}

// feedBreakdown is the medians of one variant's runs, per event.
func feedBreakdown(ms []feedMeasure, n int) string {
	per := func(f func(m feedMeasure) float64) float64 {
		v := make([]float64, len(ms))
		for i, m := range ms {
			v[i] = f(m)
		}
		return median(v)
	}
	fn := float64(n)
	s := fmt.Sprintf("startup %.1f ms, wall %.2f µs, client CPU %.2f µs, %.1f allocs, %.0f B",
		per(func(m feedMeasure) float64 { return float64(m.startup.Microseconds()) / 1e3 }),
		per(func(m feedMeasure) float64 { return float64(m.wall.Nanoseconds()) / 1e3 / float64(m.events) }),
		per(func(m feedMeasure) float64 { return float64(m.cpu.Nanoseconds()) / 1e3 / fn }),
		per(func(m feedMeasure) float64 { return float64(m.mallocs) / fn }),
		per(func(m feedMeasure) float64 { return float64(m.bytes) / fn }))
	if ms[0].server > 0 {
		s += fmt.Sprintf(", server CPU %.2f µs", per(func(m feedMeasure) float64 { return float64(m.server.Nanoseconds()) / 1e3 / fn }))
	}
	if ms[0].batches > 0 {
		s += fmt.Sprintf(", %.2f round trips and %.2f statements per batch",
			per(func(m feedMeasure) float64 { return float64(m.trips) / float64(m.batches) }),
			per(func(m feedMeasure) float64 { return float64(m.stmts) / float64(m.batches) }))
	}
	return s
}

// run runs the variant once over positions 1..head as subscriber (or
// checkpoint) name. Its wall time runs from the handling of the first
// batch to that of the last event: the steady catch-up, the same span for
// every variant; the time to the first batch (connections, the
// checkpoint row, the library's first attempt record) is its startup.
// The process's CPU, allocations and round trips are counted from the
// start to the last event, the server's CPU to the stop.
func (v *feedVariant) run(ctx context.Context, b *bench, name string, batch int, head int64) (feedMeasure, error) {
	var (
		m              feedMeasure
		first, end     time.Time
		firstPos       int64
		once           sync.Once
		done           = make(chan struct{})
		cpu1, startCPU time.Duration
		startNow       time.Time
		ms0, ms1       runtime.MemStats
		trips1, stmts1 int64
	)
	seen := func(last int64) {
		if first.IsZero() {
			first, firstPos = time.Now(), last
		}
		if last >= head {
			once.Do(func() {
				end = time.Now()
				cpu1 = processCPU()
				trips1, stmts1 = v.trips.trips.Load(), v.trips.stmts.Load()
				runtime.ReadMemStats(&ms1)
				close(done)
			})
		}
	}
	cpuBefore := b.backendCPU(ctx, v.app)
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	v.trips.trips.Store(0)
	v.trips.stmts.Store(0)
	startCPU, startNow = processCPU(), time.Now()
	var err error
	if v.be == nil {
		err = rawReader(ctx, v.raw, name, batch, head, func(events []domain.EventEnvelope[any]) {
			for _, ev := range events {
				_ = ev
			}
			seen(events[len(events)-1].Position)
		})
	} else {
		err = v.runLibrary(ctx, b, name, batch, head, seen, done)
	}
	if err != nil {
		return m, err
	}
	<-done
	if firstPos >= head {
		return m, fmt.Errorf("%s: one batch held every event: no steady span to time", name)
	}
	m.events = head - firstPos
	m.wall, m.startup = end.Sub(first), first.Sub(startNow)
	m.cpu = cpu1 - startCPU
	m.mallocs, m.bytes = ms1.Mallocs-ms0.Mallocs, ms1.TotalAlloc-ms0.TotalAlloc
	m.trips, m.stmts, m.batches = trips1, stmts1, (head+int64(batch)-1)/int64(batch)
	if d, ok := cpuDelta(cpuBefore, b.backendCPU(ctx, v.app)); ok {
		m.server = d
	}
	return m, nil
}

// runLibrary runs a subscriber with a no-op handler (or batch handler)
// from 0 until its checkpoint reaches head. seen is told the last
// position of the first batch and of each batch from there; done is
// closed when it saw head.
func (v *feedVariant) runLibrary(ctx context.Context, b *bench, name string, batch int, head int64, seen func(int64), done <-chan struct{}) error {
	opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(batch), subscriptions.WithLogger(b.libLogger())}
	var h subscriptions.Handler
	if v.batch {
		opts = append(opts, subscriptions.WithBatchHandler(func(_ context.Context, events []domain.EventEnvelope[any]) error {
			seen(events[len(events)-1].Position)
			return nil
		}))
	} else {
		h = func(_ context.Context, ev domain.EventEnvelope[any]) error {
			if ev.Position%int64(batch) == 0 || ev.Position >= head {
				seen(ev.Position)
			}
			return nil
		}
	}
	sub, err := subscriptions.NewSubscriber(name, v.db.store, v.db.cps, h, opts...)
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
	watchdog := time.NewTimer(2 * time.Minute)
	defer watchdog.Stop()
	select {
	case <-done:
	case err := <-errc:
		return fmt.Errorf("Run returned early: %v", err)
	case <-watchdog.C:
		return stop(fmt.Errorf("%s: the catch-up did not reach %d in 2 minutes", name, head))
	case <-ctx.Done():
		return stop(ctx.Err())
	}
	// The last event was handled: wait for its batch to commit.
	for {
		pos, err := v.db.cps.Position(ctx, name)
		if err != nil {
			return stop(err)
		}
		if pos >= head {
			return stop(nil)
		}
		select {
		case <-watchdog.C:
			return stop(fmt.Errorf("%s: the last event was handled but the checkpoint stays at %d < %d", name, pos, head))
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// decodeCost measures, in this process, what decoding alone costs per
// event: the rows of the first 1,000 events turned into envelopes
// (pgevents.Envelopes, the library's decoding, encoding/json as the raw
// reader's).
func decodeCost(ctx context.Context, pool *pgxpool.Pool) string {
	rows, err := pool.Query(ctx, pgevents.SelectEvents+"ORDER BY position LIMIT 1000")
	if err != nil {
		return "n/a (" + err.Error() + ")"
	}
	stored, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgevents.Row, error) {
		var r pgevents.Row
		err := row.Scan(r.Targets()...)
		return r, err
	})
	if err != nil || len(stored) == 0 {
		return fmt.Sprintf("n/a (%v)", err)
	}
	res := testing.Benchmark(func(tb *testing.B) {
		tb.ReportAllocs()
		for range tb.N {
			if _, err := pgevents.Envelopes(stored); err != nil {
				tb.Fatal(err)
			}
		}
	})
	per := float64(len(stored))
	return fmt.Sprintf("%.2f µs and %.1f allocs, %.0f B per event", float64(res.NsPerOp())/1e3/per, float64(res.AllocsPerOp())/per, float64(res.AllocedBytesPerOp())/per)
}
