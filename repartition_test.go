package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// repartProjection is a projection that every layout of a name writes:
// through the batch transaction on the database backends (a row per
// event, its primary key refusing a second commit), in memory on the
// memory backend. Each handling checks that no later event of its
// aggregate was handled before it.
type repartProjection struct {
	e     *env
	table string

	mu         sync.Mutex
	handled    map[string]int   // memory backend: handlings per event ID
	last       map[string]int64 // memory backend: per aggregate, the last position handled
	violations []string
	// fail, when set, fails the handling of the aggregates it names.
	fail atomic.Pointer[map[string]bool]
	// delay is the time each handling takes.
	delay time.Duration
}

func newRepartProjection(t *testing.T, e *env, table string) *repartProjection {
	t.Helper()
	p := &repartProjection{e: e, table: table, handled: map[string]int{}, last: map[string]int64{}}
	if e.DB != nil {
		require.NoError(t, e.DB.Exec("CREATE TABLE "+table+" (event_id text PRIMARY KEY, agg text NOT NULL, position bigint NOT NULL)").Error)
		require.NoError(t, e.DB.Exec("CREATE INDEX "+table+"_agg ON "+table+" (agg, position)").Error)
	}
	return p
}

var errRepartPoison = errors.New("this aggregate fails for now")

func (p *repartProjection) handle(ctx context.Context, ev domain.EventEnvelope[any]) error {
	time.Sleep(p.delay)
	if fail := p.fail.Load(); fail != nil && (*fail)[ev.AggregateID] {
		return fmt.Errorf("%s: %w", ev.AggregateID, errRepartPoison)
	}
	if p.e.DB == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.handled[ev.ID]++
		if last, ok := p.last[ev.AggregateID]; ok && last >= ev.Position {
			p.violations = append(p.violations, fmt.Sprintf("%s: position %d handled after %d", ev.AggregateID, ev.Position, last))
		}
		p.last[ev.AggregateID] = ev.Position
		return nil
	}
	var later int
	if err := p.e.QueryRow(ctx, "SELECT count(*) FROM "+p.table+" WHERE agg = ? AND position > ?", ev.AggregateID, ev.Position).Scan(&later); err != nil {
		return err
	}
	if later > 0 {
		p.mu.Lock()
		p.violations = append(p.violations, fmt.Sprintf("%s: position %d handled after %d later events", ev.AggregateID, ev.Position, later))
		p.mu.Unlock()
	}
	return p.e.Exec(ctx, "INSERT INTO "+p.table+" (event_id, agg, position) VALUES (?, ?, ?)", ev.ID, ev.AggregateID, ev.Position)
}

// ids returns the IDs of the events handled (committed), each as often as
// it was.
func (p *repartProjection) ids(t *testing.T) []string {
	t.Helper()
	if p.e.DB == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		var out []string
		for id, n := range p.handled {
			for range n {
				out = append(out, id)
			}
		}
		return out
	}
	return projected(t, p.e.DB, p.table)
}

// check requires every event of the feed handled exactly once, and each
// aggregate's in feed order.
func (p *repartProjection) check(t *testing.T, what string) {
	t.Helper()
	faultRequireExactlyOnce(t, what, p.ids(t), faultFeedIDs(t, p.e.Events))
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Empty(t, p.violations, "%s: per-aggregate order", what)
}

// repartWriter appends one event at a time, to one of 24 aggregates, to
// e's event store until stop; every append that failed is counted.
type repartWriter struct {
	cancel context.CancelFunc
	done   chan struct{}
	n      atomic.Int64
	failed atomic.Int64
}

func startRepartWriter(t *testing.T, e *env, every time.Duration) *repartWriter {
	t.Helper()
	events := e.Events
	if e.DB != nil && !e.Postgres() {
		// SQLite's busy handler is not fair: appends back to back could
		// keep a repartition (or a batch) waiting past the busy timeout.
		every *= 3
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &repartWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ticker := time.NewTicker(every)
		defer ticker.Stop()
		for i := 0; ; i++ {
			agg := fmt.Sprintf("repart-agg-%d", i%24)
			ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, agg, "repart.live", 0)
			if err := events.Append(context.Background(), agg, -1, ev); err != nil {
				w.failed.Add(1)
			} else {
				w.n.Add(1)
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

// waitFor waits until the writer appended n more events than when called.
func (w *repartWriter) waitFor(t *testing.T, n int64) {
	t.Helper()
	from := w.n.Load()
	require.Eventually(t, func() bool { return w.n.Load() >= from+n }, time.Minute, time.Millisecond, "the writer appends")
}

func (w *repartWriter) stop() {
	w.cancel()
	<-w.done
}

// repartSubscriber builds a subscriber of name over one replica's stores
// (partReplica) with p's handler and opts.
func repartSubscriber(t *testing.T, e *env, name string, p *repartProjection, opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
	t.Helper()
	events, cps, _ := partReplica(t, e)
	sub, err := subscriptions.NewSubscriber(name, events, cps, p.handle, append([]subscriptions.SubscriberOption{
		subscriptions.WithBatchSize(10), subscriptions.WithPollInterval(10 * time.Millisecond), subscriptions.WithLogger(quietLogger()),
	}, opts...)...)
	require.NoError(t, err)
	return sub
}

// repartCaughtUp waits until sub has no event left to handle; slower
// than waitCaughtUp allows on a loaded machine, where SQLite's one writer
// takes the backlog of a live writer one batch at a time.
func repartCaughtUp(t *testing.T, sub *subscriptions.Subscriber) {
	t.Helper()
	require.Eventually(t, func() bool {
		lag, err := sub.Lag(context.Background())
		return err == nil && lag == 0
	}, 2*time.Minute, 5*time.Millisecond, "subscriber %q did not catch up", sub.Name())
}

// requireStoppedWithChange requires that each Run returned
// ErrPartitionsChanged.
func requireStoppedWithChange(t *testing.T, what string, runs ...*running) {
	t.Helper()
	for i, r := range runs {
		res := r.wait(t)
		require.False(t, res.panicked, "%s: replica %d panicked: %v", what, i, res.panicVal)
		require.ErrorIs(t, res.err, subscriptions.ErrPartitionsChanged, "%s: replica %d", what, i)
	}
}

// TestRepartitionWhileRunning: three replicas of a subscriber with 4
// partitions (2 workers each; on Postgres a pool each) run while events
// are appended, and a fourth Subscriber repartitions the name to 6. The
// replicas stop with ErrPartitionsChanged; Status and PartitionLags of
// the new count show 6 partitions at once, while the old count is
// refused; three replicas with 6 partitions take over, appends going on.
// At the end every event was handled exactly once, each aggregate's in
// feed order.
func TestRepartitionWhileRunning(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "repart-live"
			p := newRepartProjection(t, e, "repart_live")
			// A backlog, so that the partitions are at different places
			// when the repartition comes. On SQLite a smaller one, handled
			// at full speed: the catch-up holds the write lock, which the
			// writer's appends wait for.
			sqlite := e.DB != nil && !e.Postgres()
			backlog := 400
			if sqlite {
				backlog = 100
			} else {
				p.delay = time.Millisecond
			}
			partAppend(t, e.Events, map[string]int{}, 24, backlog)
			w := startRepartWriter(t, e, 5*time.Millisecond)
			old := make([]*running, 3)
			for i := range old {
				old[i] = start(t, repartSubscriber(t, e, name, p, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2)))
			}
			w.waitFor(t, 20)
			logger, logs := newLogger()
			next := repartSubscriber(t, e, name, p, subscriptions.WithPartitions(6), subscriptions.WithConcurrency(2), subscriptions.WithLogger(logger))
			require.Eventually(t, func() bool {
				_, err := next.Status(ctx)
				return errors.Is(err, subscriptions.ErrPartitionsChanged)
			}, time.Minute, time.Millisecond, "the replicas record 4 partitions, which a Subscriber of 6 is refused")
			require.NoError(t, next.Repartition(ctx, 6))
			st, err := next.Status(ctx)
			require.NoError(t, err)
			require.Len(t, st.Partitions, 6)
			lags, err := next.PartitionLags(ctx)
			require.NoError(t, err)
			require.Len(t, lags, 6)
			requireStoppedWithChange(t, "old replicas", old...)
			_, err = repartSubscriber(t, e, name, p, subscriptions.WithPartitions(4)).Status(ctx)
			require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged, "after: the old count is refused")
			require.ErrorContains(t, err, "has checkpoints for 6 partitions")

			runs := []*running{start(t, next)}
			for range 2 {
				runs = append(runs, start(t, repartSubscriber(t, e, name, p, subscriptions.WithPartitions(6), subscriptions.WithConcurrency(2))))
			}
			w.waitFor(t, 30)
			w.stop()
			if !sqlite { // on SQLite an append may outwait the busy timeout
				require.Zero(t, w.failed.Load(), "appends failed")
			}
			repartCaughtUp(t, next)
			for _, r := range runs {
				r.stop(t)
			}
			p.check(t, "4 to 6 partitions while running")
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "subscriber repartitioned") {
					t.Log(line) // how many events the catch-up handled
				}
			}
		})
	}
}

// TestRepartitionUnpartitionedBothWays: an unpartitioned subscriber runs
// while events are appended and is repartitioned to 3 partitions (it
// stops with ErrPartitionsChanged at its next batch or poll), the
// partitioned one takes over and, idle, is repartitioned back to
// unpartitioned (it stops too), after which a partitioned Subscriber is
// refused and an unpartitioned one goes on. Every event is handled once,
// in feed order per aggregate.
func TestRepartitionUnpartitionedBothWays(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "repart-plain"
			p := newRepartProjection(t, e, "repart_plain")
			partAppend(t, e.Events, map[string]int{}, 24, 60)
			w := startRepartWriter(t, e, 2*time.Millisecond)
			plain := repartSubscriber(t, e, name, p)
			run := start(t, plain)
			w.waitFor(t, 20)
			require.NoError(t, plain.Repartition(ctx, 3))
			requireStoppedWithChange(t, "unpartitioned", run)
			_, err := plain.Lag(ctx)
			require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged)

			parted := repartSubscriber(t, e, name, p, subscriptions.WithPartitions(3), subscriptions.WithConcurrency(3))
			run = start(t, parted)
			w.waitFor(t, 20)
			w.stop()
			repartCaughtUp(t, parted)
			require.NoError(t, parted.Repartition(ctx, 0), "from the idle partitioned subscriber")
			requireStoppedWithChange(t, "partitioned", run)
			_, err = parted.Status(ctx)
			require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged)
			require.ErrorContains(t, err, "unpartitioned checkpoints")
			require.NoError(t, parted.Repartition(ctx, 0), "repartitioning to the recorded count does nothing")

			partAppend(t, e.Events, map[string]int{}, 24, 20)
			again := repartSubscriber(t, e, name, p)
			run = start(t, again)
			waitCaughtUp(t, again)
			st, err := again.Status(ctx)
			require.NoError(t, err)
			require.Empty(t, st.Partitions)
			run.stop(t)
			p.check(t, "unpartitioned to 3 partitions and back")
		})
	}
}

// TestRepartitionCatchesUpTheLaggards: partition A of 4 halts on a
// failing aggregate while the others go on. A Repartition then has A's
// events up to the highest checkpoint to handle: while they fail it
// changes nothing (the error names the event) and the replica keeps
// running; once they succeed (the replica stopped) it handles exactly
// those, in the repartition's transaction, and not the event appended
// after that position, which the new layout handles. A WaitCaughtUp of
// the old count in progress ends with ErrPartitionsChanged.
func TestRepartitionCatchesUpTheLaggards(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "repart-lag"
			p := newRepartProjection(t, e, "repart_lag")
			// Two aggregates in different partitions of 4.
			aggA, aggB := "lag-a", ""
			for i := 0; aggB == ""; i++ {
				if c := fmt.Sprintf("lag-b-%d", i); subscriptions.PartitionOf(c, 4) != subscriptions.PartitionOf(aggA, 4) {
					aggB = c
				}
			}
			appendTo := func(agg string) domain.EventEnvelope[any] {
				ev := domain.NewEventEnvelope[any](map[string]any{}, agg, "repart.lag", 0)
				require.NoError(t, e.Events.Append(ctx, agg, -1, ev))
				return ev
			}
			p.fail.Store(&map[string]bool{aggA: true})
			a1, b1, a2, b2 := appendTo(aggA), appendTo(aggB), appendTo(aggA), appendTo(aggB)
			sub := repartSubscriber(t, e, name, p, subscriptions.WithPartitions(4))
			run := start(t, sub)
			require.Eventually(t, func() bool {
				lags, err := sub.PartitionLags(ctx)
				return err == nil && lags[subscriptions.PartitionOf(aggB, 4)] == 0
			}, time.Minute, 5*time.Millisecond, "B's partition goes on")
			a3 := appendTo(aggA) // past every checkpoint: not the catch-up's

			err := sub.Repartition(ctx, 2)
			require.ErrorIs(t, err, errRepartPoison)
			require.ErrorContains(t, err, a1.ID, "the error names the failing event")
			lags, err := sub.PartitionLags(ctx)
			require.NoError(t, err, "still 4 partitions")
			require.EqualValues(t, 3, lags[subscriptions.PartitionOf(aggA, 4)])
			require.False(t, run.returned(), "the replica keeps running")

			// A WaitCaughtUp of the old count, waiting on A, ends with the
			// repartition: the old rows are retired, not caught up.
			waited := make(chan error, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				_, err := sub.WaitCaughtUp(wctx)
				waited <- err
			}()
			run.stop(t)
			p.fail.Store(nil)
			require.NoError(t, sub.Repartition(ctx, 2))
			require.ErrorIs(t, <-waited, subscriptions.ErrPartitionsChanged)
			require.ElementsMatch(t, []string{b1.ID, b2.ID, a1.ID, a2.ID}, p.ids(t),
				"the catch-up handled A's events up to B's checkpoint, not %s", a3.ID)
			feed, err := e.Events.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, b2.ID, feed[3].ID)
			next := repartSubscriber(t, e, name, p, subscriptions.WithPartitions(2))
			st, err := next.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, feed[3].Position, st.Partitions[0].Position)
			require.Equal(t, feed[3].Position, st.Partitions[1].Position, "both new partitions start at B's checkpoint")
			require.EqualValues(t, 1, st.Lag)
			run = start(t, next)
			waitCaughtUp(t, next)
			run.stop(t)
			p.check(t, "catch-up")
		})
	}
}

// TestRepartitionThenDeleteStateStartsAfresh: once a repartition left
// retired rows of the old count, DeleteState of the new one and a fresh
// start with the old count (or unpartitioned) replay from 0.
func TestRepartitionThenDeleteStateStartsAfresh(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			var handled atomic.Int64
			count := func(context.Context, domain.EventEnvelope[any]) error { handled.Add(1); return nil }
			newSub := func(opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
				sub, err := subscriptions.NewSubscriber("repart-fresh", e.Events, e.Checkpoints, count,
					append([]subscriptions.SubscriberOption{subscriptions.WithPollInterval(5 * time.Millisecond), subscriptions.WithLogger(quietLogger())}, opts...)...)
				require.NoError(t, err)
				return sub
			}
			partAppend(t, e.Events, map[string]int{}, 12, 30)
			for _, step := range []struct {
				from, to int
			}{{4, 2}, {0, 3}} {
				first := newSub(partitionsOpt(step.from)...)
				run := start(t, first)
				waitCaughtUp(t, first)
				run.stop(t)
				require.NoError(t, first.Repartition(ctx, step.to))
				after := newSub(partitionsOpt(step.to)...)
				require.NoError(t, after.DeleteState(ctx))
				handled.Store(0)
				fresh := newSub(partitionsOpt(step.from)...)
				run = start(t, fresh)
				waitCaughtUp(t, fresh)
				run.stop(t)
				require.EqualValues(t, 30, handled.Load(), "%d to %d, deleted, then %d again: a replay from 0", step.from, step.to, step.from)
				require.NoError(t, fresh.DeleteState(ctx))
			}
		})
	}
}

// partitionsOpt is WithPartitions(n), or nothing for 0.
func partitionsOpt(n int) []subscriptions.SubscriberOption {
	if n == 0 {
		return nil
	}
	return []subscriptions.SubscriberOption{subscriptions.WithPartitions(n)}
}

// TestRepartitionRefusals: a count out of range, a store without the
// capability, a checkpoint past the feed head, and catch-up while the name
// is paused are refused, changing nothing.
func TestRepartitionRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends()[:1] {
		e := b.New(t)
		noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
		sub, err := subscriptions.NewSubscriber("repart-no", e.Events, e.Checkpoints, noop, subscriptions.WithPartitions(2), subscriptions.WithLogger(quietLogger()))
		require.NoError(t, err)
		require.ErrorContains(t, sub.Repartition(ctx, -1), "between 0 (unpartitioned) and 1024")
		require.ErrorContains(t, sub.Repartition(ctx, subscriptions.MaxPartitions+1), "between 0")
		plain, err := subscriptions.NewSubscriber("repart-no", e.Events, plainCheckpointStore{e.Checkpoints}, noop)
		require.NoError(t, err)
		require.ErrorIs(t, plain.Repartition(ctx, 2), errors.ErrUnsupported)

		partAppend(t, e.Events, map[string]int{}, 6, 12)
		run := start(t, sub) // records the count
		waitCaughtUp(t, sub)
		run.stop(t)
		require.NoError(t, sub.ResetCheckpoint(ctx, 99))
		require.ErrorIs(t, sub.Repartition(ctx, 3), subscriptions.ErrCheckpointAhead)
		require.NoError(t, sub.ResetCheckpoint(ctx, 0))
		require.NoError(t, e.Checkpoints.Reset(ctx, "repart-no/partition-1-of-2", 12)) // partition 0 lags
		require.NoError(t, sub.Pause(ctx, "test"))
		require.ErrorContains(t, sub.Repartition(ctx, 3), "is paused")
		require.NoError(t, sub.Resume(ctx))
		lags, err := sub.PartitionLags(ctx)
		require.NoError(t, err, "still 2 partitions")
		require.Positive(t, slices.Max(lags))
		require.NoError(t, sub.Repartition(ctx, 3))
	}
}

// TestRepartitionToMaxPartitions: the largest layout is written and
// replaced in one transaction like any other (the stores write its rows
// in statements of bounded size).
func TestRepartitionToMaxPartitions(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			partAppend(t, e.Events, map[string]int{}, 6, 10)
			sub := repartSubscriberOf(t, e, "repart-max", 0)
			require.NoError(t, sub.ResetCheckpoint(ctx, 10))
			require.NoError(t, sub.Repartition(ctx, subscriptions.MaxPartitions))
			big := repartSubscriberOf(t, e, "repart-max", subscriptions.MaxPartitions)
			st, err := big.Status(ctx)
			require.NoError(t, err)
			require.Len(t, st.Partitions, subscriptions.MaxPartitions)
			require.Zero(t, st.Lag)
			require.NoError(t, big.Repartition(ctx, 7))
			lags, err := repartSubscriberOf(t, e, "repart-max", 7).PartitionLags(ctx)
			require.NoError(t, err)
			require.Equal(t, make([]int64, 7), lags)
		})
	}
}

// repartSubscriberOf is a subscriber of name with n partitions (0: none)
// on e's stores, whose handler does nothing.
func repartSubscriberOf(t *testing.T, e *env, name string, n int) *subscriptions.Subscriber {
	t.Helper()
	sub, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, func(context.Context, domain.EventEnvelope[any]) error { return nil },
		append(partitionsOpt(n), subscriptions.WithLogger(quietLogger()))...)
	require.NoError(t, err)
	return sub
}

// TestRepartitionOnOneConnection: on Postgres pools of one connection
// (GORM's and pgxstore's), a repartition with events to catch up
// completes: its transaction holds the connection, and it reads the feed
// and runs the handler through that transaction, never waiting for a
// second one (doc.go, Connections).
func TestRepartitionOnOneConnection(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"gorm", "pgx"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			pg := dbtest.NewPostgres(t)
			var e *env
			if backend == "pgx" {
				cfg, err := pgxpool.ParseConfig(pg.DSN)
				require.NoError(t, err)
				cfg.MaxConns = 1
				pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				e = pgxEnvOn(t, pg, pool)
			} else {
				gdb := pg.Open(t)
				sqlDB, err := gdb.DB()
				require.NoError(t, err)
				e = gormEnv(t, "postgres", gdb, pg)
				sqlDB.SetMaxOpenConns(1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p := newRepartProjection(t, e, "repart_one")
			partAppend(t, e.Events, map[string]int{}, 12, 24)
			sub, err := subscriptions.NewSubscriber("repart-one", e.Events, e.Checkpoints, p.handle, subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			require.NoError(t, sub.Repartition(ctx, 2))
			head, err := e.Events.HeadPosition(ctx)
			require.NoError(t, err)
			require.NoError(t, e.Checkpoints.Reset(ctx, "repart-one/partition-0-of-2", head)) // partition 1 lags
			require.NoError(t, sub.Repartition(ctx, 3))
			feed, err := e.Events.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			var lagging []string
			for _, ev := range feed {
				if subscriptions.PartitionOf(ev.AggregateID, 2) == 1 {
					lagging = append(lagging, ev.ID)
				}
			}
			require.NotEmpty(t, lagging)
			require.ElementsMatch(t, lagging, p.ids(t), "the catch-up handled partition 1's events")
		})
	}
}

// TestRepartitionRefusesToPassAParkedHead: under WithOrderedParking, a
// repartition whose catch-up would hand a handler an aggregate's event
// behind its parked one (which a batch would hold) is refused, and
// changes nothing.
func TestRepartitionRefusesToPassAParkedHead(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "repart-held"
			p := newRepartProjection(t, e, "repart_held")
			aggA, aggB := "held-a", ""
			for i := 0; aggB == ""; i++ {
				if c := fmt.Sprintf("held-b-%d", i); subscriptions.PartitionOf(c, 4) != subscriptions.PartitionOf(aggA, 4) {
					aggB = c
				}
			}
			appendTo := func(agg string) domain.EventEnvelope[any] {
				ev := domain.NewEventEnvelope[any](map[string]any{}, agg, "repart.held", 0)
				require.NoError(t, e.Events.Append(ctx, agg, -1, ev))
				stored, err := e.Events.GetEventByID(ctx, ev.ID)
				require.NoError(t, err)
				return stored
			}
			p.fail.Store(&map[string]bool{aggA: true})
			a1 := appendTo(aggA)
			sub := repartSubscriber(t, e, name, p, subscriptions.WithPartitions(4), subscriptions.WithParkingLot(e.Parking),
				subscriptions.WithOrderedParking(), subscriptions.WithMaxRetries(0))
			run := start(t, sub)
			require.Eventually(t, func() bool {
				parked, err := sub.ListParked(ctx)
				return err == nil && len(parked) == 1
			}, time.Minute, 5*time.Millisecond, "A's first event is parked")
			run.stop(t)
			p.fail.Store(nil)
			a2, b1 := appendTo(aggA), appendTo(aggB)
			// B's partition has gone past A's new event, as its replica
			// would have; A's partition lags behind it.
			require.NoError(t, e.Checkpoints.Reset(ctx, fmt.Sprintf("%s/partition-%d-of-4", name, subscriptions.PartitionOf(aggB, 4)), b1.Position))

			err := sub.Repartition(ctx, 2)
			require.ErrorIs(t, err, subscriptions.ErrParkedBehindHead)
			require.ErrorContains(t, err, a2.ID)
			require.NotContains(t, p.ids(t), a2.ID, "not handled past its parked head %s", a1.ID)
			require.Equal(t, 4, sub.Partitions())
			lags, err := sub.PartitionLags(ctx)
			require.NoError(t, err, "still 4 partitions")
			require.EqualValues(t, 1, lags[subscriptions.PartitionOf(aggA, 4)])
		})
	}
}
