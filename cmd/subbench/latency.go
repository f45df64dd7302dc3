package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// latencies summarises one pass of timed appends.
type latencies struct {
	wake   []time.Duration // append start -> handler start (or notification)
	append []time.Duration // append start -> Append returned
	// append start -> the same notification received on a bare LISTEN
	// connection running alongside.
	bare []time.Duration
	// notification received on that bare connection -> handler start.
	afterNotify []time.Duration
	// per recorded append: append start and handler start.
	starts, handled []time.Time
}

// percentile is the nearest-rank percentile of sorted values, in ms.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i]) / float64(time.Millisecond)
}

func sortedCopy(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// latencyEnv is the wiring shared by the passes of scenario 4.
type latencyEnv struct {
	b         *bench
	dsn       string
	writer    domain.EventStore // the pass's backend's, on a one-connection pool
	writerPID uint32            // that connection's backend
	// subs are the subscribers' pools, one per backend.
	subs  map[*backend]*backendDB
	spans *spanTracer // the subscriber pools' statements
	sz    sizes
}

// runLatency: scenario 4.
func runLatency(ctx context.Context, b *bench) ([]Row, error) {
	sz := b.sizes()
	dsn, err := b.newSchema(ctx, "latency")
	if err != nil {
		return nil, err
	}
	spans := &spanTracer{}
	subDB, err := b.openPG(dsn, 4, spans)
	if err != nil {
		return nil, err
	}
	if err := subDB.Exec("CREATE TABLE unrelated (id bigserial PRIMARY KEY, note text NOT NULL)").Error; err != nil {
		return nil, err
	}
	e := &latencyEnv{b: b, dsn: dsn, subs: map[*backend]*backendDB{}, spans: spans, sz: sz}
	if e.subs[gormBackend], err = gormBackendDB(subDB); err != nil {
		return nil, err
	}
	if e.subs[pgxBackend], err = pgxBackend.open(ctx, b, dsn, "", 4, spans); err != nil {
		return nil, err
	}

	rtt, err := roundTrips(ctx, dsn, subDB, 20*sz.latencyWarmup+100)
	if err != nil {
		return nil, err
	}
	b.note("latency: one SELECT 1 round trip on this machine, p50 (p99): " + rtt)

	var rows []Row
	for _, c := range []struct {
		label, key  string
		open, async bool
	}{
		{"quiet", "quiet", false, false},
		{"unrelated tx open", "open", true, false},
		{"diagnostic, async commit", "async", false, true},
	} {
		for _, be := range pgBackends {
			if c.async && be != gormBackend {
				continue // the diagnostic is of the wake path, not of a backend
			}
			r, err := e.pass(ctx, be, c.label, c.key, c.open, c.async)
			rows = append(rows, r...)
			if err != nil {
				return rows, fmt.Errorf("%s: %w", be.label(c.label), err)
			}
		}
	}
	return rows, nil
}

// pass measures one pass of scenario 4 on backend be: its writer appends,
// its subscriber is woken by a PostgresListener on its store's channel.
// open keeps an unrelated write transaction open throughout; async turns
// the writer's synchronous_commit off. The pass's writer pool is closed
// when it returns.
func (e *latencyEnv) pass(ctx context.Context, be *backend, label, key string, open, async bool) ([]Row, error) {
	sz := e.sz
	defer e.b.casePools()()
	if err := e.useWriter(ctx, be, async); err != nil {
		return nil, err
	}
	var stop func() (int, error)
	if open {
		var err error
		if stop, err = holdUnrelated(ctx, e.dsn, sz.unrelatedHold); err != nil {
			return nil, err
		}
	}
	name := "latency-" + key
	if be != gormBackend {
		name = be.name + "-" + name
	}
	lib, err := e.library(ctx, e.subs[be], name)
	held := 0
	if stop != nil {
		var serr error
		held, serr = stop()
		err = errors.Join(err, serr)
	}
	if err != nil {
		return nil, err
	}
	lw, bw := sortedCopy(lib.wake), sortedCopy(lib.bare)
	la, an := sortedCopy(lib.append), sortedCopy(lib.afterNotify)
	bname := "a bare pgx LISTEN connection, running alongside: append start -> the same notification received"
	note := fmt.Sprintf("%s backend (its event store appends, its checkpoint store's subscriber handles): %d appends (one event each) spaced %s apart; PostgresListener, poll interval 1s; Append itself (to commit) took p50 %.2f / p99 %.2f ms",
		be.name, len(lib.wake), sz.latencySpacing, percentile(la, 50), percentile(la, 99))
	if open {
		note += fmt.Sprintf("; another connection kept an INSERT transaction open %s at a time, back to back (%d such transactions)", sz.unrelatedHold, held)
	}
	var rows []Row
	for _, p := range []struct {
		name string
		p    float64
		goal float64
	}{{"p50", 50, 2}, {"p90", 90, 0}, {"p99", 99, 5}, {"max", 100, 0}} {
		r := newRow(be.label(fmt.Sprintf("%s: %s append->handler", label, p.name)), percentile(lw, p.p), percentile(bw, p.p), "ms", bname).note(note)
		if async {
			r = r.note("diagnostic only: the writer runs with synchronous_commit=off, so the appends' commits do not wait for the WAL flush (not a durable configuration): the wake path without the disk")
		}
		if p.goal > 0 && !async {
			r = r.goal(fmt.Sprintf("<= %g ms", p.goal), r.Figure <= p.goal)
		}
		rows = append(rows, r)
	}
	breakdown := e.spans.breakdown(lib.starts, lib.handled)
	for _, p := range []float64{50, 99} {
		rows = append(rows, newRow(be.label(fmt.Sprintf("%s: p%g notification->handler", label, p)), percentile(an, p), 0, "ms", "").
			note(be.name+": the library's own share, per append: the notification received on the bare connection -> handler start").
			note(breakdown))
	}
	return rows, nil
}

type hit struct {
	id string
	at time.Time
}

// timedAppends appends warmup+n single events one after another, waiting
// for each to arrive (wait returns the arrival time) and sleeping the
// spacing in between; the first warmup ones are not recorded.
func (e *latencyEnv) timedAppends(ctx context.Context, aggregate string, wait func(ctx context.Context, id string) (at, notified time.Time, err error)) (latencies, error) {
	var out latencies
	total := e.sz.latencyWarmup + e.sz.latencyAppends
	for i := range total {
		ev := makeEvents(1, i)[0]
		t0 := time.Now()
		if err := e.writer.Append(ctx, aggregate, -1, ev); err != nil {
			return out, err
		}
		appended := time.Since(t0)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		at, notified, err := wait(wctx, ev.ID)
		cancel()
		if err != nil {
			return out, fmt.Errorf("append %d: %w", i, err)
		}
		if i >= e.sz.latencyWarmup {
			out.wake = append(out.wake, at.Sub(t0))
			out.append = append(out.append, appended)
			out.bare = append(out.bare, notified.Sub(t0))
			out.starts = append(out.starts, t0)
			out.handled = append(out.handled, at)
			out.afterNotify = append(out.afterNotify, at.Sub(notified))
		}
		if !ctxsleep.Sleep(ctx, e.sz.latencySpacing) {
			return out, ctx.Err()
		}
	}
	return out, nil
}

// useWriter opens the writer, an event store of be: a pool of one
// connection, so that its backend PID tells its notifications apart from
// those of other processes appending to other schemas of the same database
// (the channel is database-wide). async turns synchronous_commit off for
// it.
func (e *latencyEnv) useWriter(ctx context.Context, be *backend, async bool) error {
	dsn := e.dsn
	if async {
		u, err := url.Parse(dsn)
		if err != nil {
			return err
		}
		q := u.Query()
		q.Set("synchronous_commit", "off")
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	w, err := be.open(ctx, e.b, dsn, "", 1, nil)
	if err != nil {
		return err
	}
	e.writer = w.store
	var pid int64
	if err := w.scan(ctx, "SELECT pg_backend_pid()", &pid); err != nil {
		return fmt.Errorf("the writer's backend PID: %w", err)
	}
	e.writerPID = uint32(pid)
	var sc string
	if err := w.scan(ctx, "SHOW synchronous_commit", &sc); err != nil {
		return fmt.Errorf("the writer's synchronous_commit: %w", err)
	}
	if async && sc != "off" {
		return fmt.Errorf("the writer's synchronous_commit is %q, want off", sc)
	}
	return nil
}

// library measures append start -> handler start through a subscriber on
// sub woken by a PostgresListener on sub's channel.
func (e *latencyEnv) library(ctx context.Context, sub *backendDB, name string) (latencies, error) {
	listener, err := subscriptions.NewPostgresListener(e.dsn, subscriptions.WithListenerChannel(sub.channel), subscriptions.WithListenerLogger(e.b.libLogger()))
	if err != nil {
		return latencies{}, err
	}
	store, cps := sub.store, sub.cps
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return latencies{}, err
	}
	// Start past the events of earlier passes.
	if err := cps.Reset(ctx, name, head); err != nil {
		return latencies{}, err
	}
	hits := make(chan hit, e.sz.latencyWarmup+e.sz.latencyAppends+16)
	handler := func(_ context.Context, ev domain.EventEnvelope[any]) error {
		select {
		case hits <- hit{ev.ID, time.Now()}:
		default:
		}
		return nil
	}
	subscriber, err := subscriptions.NewSubscriber(name, store, cps, handler,
		subscriptions.WithWakeSignal(listener.Subscribe()), subscriptions.WithPollInterval(time.Second),
		subscriptions.WithLogger(e.b.libLogger()))
	if err != nil {
		return latencies{}, err
	}
	notes, stopBare, err := e.startBareListener(ctx, sub.channel)
	if err != nil {
		return latencies{}, err
	}
	defer stopBare()
	e.spans.start()
	defer e.spans.stop()
	rctx, cancel := context.WithCancel(ctx)
	lerr, serr := make(chan error, 1), make(chan error, 1)
	go func() { lerr <- listener.Run(rctx) }()
	go func() { serr <- subscriber.Run(rctx) }()
	out, err := e.timedAppends(ctx, name, func(ctx context.Context, id string) (at, notified time.Time, err error) {
		for at.IsZero() {
			select {
			case h := <-hits:
				if h.id == id {
					at = h.at
				}
			case <-ctx.Done():
				return at, notified, fmt.Errorf("the handler did not see event %s: %w", id, ctx.Err())
			}
		}
		select {
		case notified = <-notes:
		case <-ctx.Done():
			return at, notified, fmt.Errorf("no notification for event %s on the bare LISTEN connection: %w", id, ctx.Err())
		}
		return at, notified, nil
	})
	cancel()
	return out, errors.Join(err, <-lerr, <-serr)
}

// startBareListener LISTENs on channel on a plain pgx connection and sends
// the time each notification from the writer's backend is received.
func (e *latencyEnv) startBareListener(ctx context.Context, channel string) (<-chan time.Time, func(), error) {
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	notes := make(chan time.Time, e.sz.latencyWarmup+e.sz.latencyAppends+16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				return
			}
			if n.PID == e.writerPID {
				select {
				case notes <- time.Now():
				default:
				}
			}
		}
	}()
	return notes, func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	}, nil
}

// holdUnrelated keeps a write transaction open on another connection, on
// another table, for hold at a time, back to back, until stop is called.
// It returns once the first transaction has written its row; stop returns
// how many transactions were held.
func holdUnrelated(ctx context.Context, dsn string, hold time.Duration) (stop func() (int, error), err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	started := make(chan error, 1)
	var (
		count int
		herr  error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := true
		hold1 := func() error {
			tx, err := conn.Begin(hctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(hctx, "INSERT INTO unrelated (note) VALUES ('held open by subbench')"); err != nil {
				_ = tx.Rollback(context.Background())
				return err
			}
			count++
			if first {
				first = false
				started <- nil
			}
			ctxsleep.Sleep(hctx, hold)
			return tx.Commit(context.Background())
		}
		for hctx.Err() == nil {
			if err := hold1(); err != nil {
				if hctx.Err() == nil {
					herr = err
				}
				break
			}
		}
		if first {
			started <- fmt.Errorf("hold an unrelated transaction: %w", errors.Join(herr, hctx.Err()))
		}
	}()
	stop = func() (int, error) {
		cancel()
		<-done
		_ = conn.Close(context.Background())
		return count, herr
	}
	if err := <-started; err != nil {
		_, _ = stop()
		return nil, err
	}
	return stop, nil
}

// span is one statement on the subscriber's pool, as pgx saw it.
type span struct {
	kind       string
	start, end time.Time
}

// spanTracer records the statements of a pool while started.
type spanTracer struct {
	mu    sync.Mutex
	on    bool
	spans []span
}

type spanStartKey struct{}

func (t *spanTracer) start() {
	t.mu.Lock()
	t.on, t.spans = true, t.spans[:0]
	t.mu.Unlock()
}

func (t *spanTracer) stop() {
	t.mu.Lock()
	t.on = false
	t.mu.Unlock()
}

func (t *spanTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, spanStartKey{}, span{kind: statementKind(data.SQL), start: time.Now()})
}

func (t *spanTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	sp, ok := ctx.Value(spanStartKey{}).(span)
	if !ok {
		return
	}
	sp.end = time.Now()
	t.mu.Lock()
	if t.on {
		t.spans = append(t.spans, sp)
	}
	t.mu.Unlock()
}

// statementKinds names the subscriber's statements, first match wins: a
// prefix of the folded statement text, or a part of it.
var statementKinds = []struct {
	prefix bool
	text   string
	kind   string
}{
	{true, "begin", "BEGIN"},
	{true, "commit", "COMMIT"},
	{true, "rollback", "ROLLBACK"},
	{false, "for update", "lock checkpoint"},
	{false, "from subscriber_checkpoints", "read checkpoint"},
	{false, "from events where position = any", "read partition by positions"},
	{false, "select position, aggregate_id from events", "read feed positions"},
	{false, "from events where position > $1 and mod(", "read partition (hash filter)"},
	{false, "from events where position >", "read feed"},
	{false, "max(position)", "read head"},
	{true, "update subscriber_checkpoints", "advance checkpoint"},
	{true, "insert into subscriber_checkpoints", "create checkpoint"},
	{false, "_projection", "handler upsert"},
}

// statementKind names the subscriber's statement sql (statementKinds), or
// "other".
func statementKind(sql string) string {
	s := strings.ToLower(strings.Join(strings.Fields(sql), " "))
	for _, k := range statementKinds {
		if k.prefix && strings.HasPrefix(s, k.text) || !k.prefix && strings.Contains(s, k.text) {
			return k.kind
		}
	}
	return "other"
}

// breakdown describes, per append, the statements the subscriber's pool
// ran between the append's start and the handler's start: how many, of
// which kinds, and the time spent inside them.
func (t *spanTracer) breakdown(starts, handled []time.Time) string {
	t.mu.Lock()
	spans := slices.Clone(t.spans)
	t.mu.Unlock()
	if len(starts) == 0 {
		return ""
	}
	counts := make([]int, len(starts))
	inside := make([]time.Duration, len(starts))
	kinds := map[string]int{}
	durs := map[string][]time.Duration{}
	for _, sp := range spans {
		// The append whose window [start, handled] holds this statement.
		i := sort.Search(len(starts), func(i int) bool { return starts[i].After(sp.start) }) - 1
		if i < 0 || sp.end.After(handled[i]) {
			continue
		}
		counts[i]++
		inside[i] += sp.end.Sub(sp.start)
		kinds[sp.kind]++
		durs[sp.kind] = append(durs[sp.kind], sp.end.Sub(sp.start))
	}
	c := make([]time.Duration, len(counts))
	for i, n := range counts {
		c[i] = time.Duration(n)
	}
	sc, si := sortedCopy(c), sortedCopy(inside)
	var ks []string
	for k, n := range kinds {
		ks = append(ks, fmt.Sprintf("%s %.2f × p50 %.2f ms", k, float64(n)/float64(len(starts)), percentile(sortedCopy(durs[k]), 50)))
	}
	slices.Sort(ks)
	return fmt.Sprintf("between append start and handler start the subscriber ran p50 %d statements (per append: %s), p50 %.2f ms / p99 %.2f ms of it inside them (client-observed round trips)",
		int64(sc[len(sc)/2]), strings.Join(ks, ", "), percentile(si, 50), percentile(si, 99))
}

// roundTrips times n SELECT 1 round trips three ways, to tell the wire
// from the client stack: a bare pgx connection, database/sql over pgx's
// driver, and GORM's Raw+Scan (what the library's statements go through).
func roundTrips(ctx context.Context, dsn string, db *gorm.DB, n int) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	pool, err := db.DB()
	if err != nil {
		return "", err
	}
	ways := []struct {
		name string
		one  func() error
	}{
		{"pgx", func() error {
			var v int
			return conn.QueryRow(ctx, "SELECT 1").Scan(&v)
		}},
		{"database/sql", func() error {
			var v int
			return pool.QueryRowContext(ctx, "SELECT 1").Scan(&v)
		}},
		{"GORM Raw+Scan", func() error {
			var v []int
			return db.WithContext(ctx).Raw("SELECT 1").Scan(&v).Error
		}},
	}
	var parts []string
	for _, w := range ways {
		d := make([]time.Duration, 0, n)
		for i := range n + 10 {
			t0 := time.Now()
			if err := w.one(); err != nil {
				return "", err
			}
			if i >= 10 {
				d = append(d, time.Since(t0))
			}
		}
		d = sortedCopy(d)
		parts = append(parts, fmt.Sprintf("%s %.3f (%.3f) ms", w.name, percentile(d, 50), percentile(d, 99)))
	}
	return strings.Join(parts, ", "), nil
}
