package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestSubscriberProcessesInOrderAndResumes: every event is handled once, in
// feed order; a new Subscriber with the same name (as after a restart)
// continues right after the checkpoint, repeating and skipping nothing.
func TestSubscriberProcessesInOrderAndResumes(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			const name = "core-resume"
			appendN(t, e.Events, "core.resume", 0, 25)

			first := &coreRecorder{}
			sub := coreNewSub(t, name, e.Events, e.Checkpoints,
				func(ctx context.Context, ev coreEnvelope) error { first.record(ctx, ev); return nil },
				subscriptions.WithBatchSize(7))
			run := start(t, sub)
			waitCaughtUp(t, sub)
			run.stop(t)
			require.Equal(t, coreIDs(coreFeed(t, e.Events)), first.ids())

			appendN(t, e.Events, "core.resume", 25, 15)
			feed := coreFeed(t, e.Events)
			require.Len(t, feed, 40)

			// The restarted process: a new subscriber and, for databases, a
			// new checkpoint store (and on Postgres a new pool and event store).
			events, cps := e.reopen(t)
			second := &coreRecorder{}
			sub2 := coreNewSub(t, name, events, cps,
				func(ctx context.Context, ev coreEnvelope) error { second.record(ctx, ev); return nil },
				subscriptions.WithBatchSize(7))
			run2 := start(t, sub2)
			waitCaughtUp(t, sub2)
			run2.stop(t)

			require.Equal(t, coreIDs(feed[25:]), second.ids(), "the restart continues right after the checkpoint")
			all := append(first.snapshot(), second.snapshot()...)
			require.Equal(t, coreIDs(feed), coreIDs(all))
			for i := 1; i < len(all); i++ {
				require.Greater(t, all[i].Position, all[i-1].Position, "positions must strictly increase")
			}
			pos, err := cps.Position(context.Background(), name)
			require.NoError(t, err)
			require.Equal(t, feed[39].Position, pos)
		})
	}
}

// TestSubscriberHandlerSeesBatchTx: handlers run with the batch transaction
// in their context on database backends, and with none in memory.
func TestSubscriberHandlerSeesBatchTx(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			appendN(t, e.Events, "core.tx", 0, 4)
			rec := &coreRecorder{}
			sub := coreNewSub(t, "core-tx", e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
				rec.record(ctx, ev)
				if e.InTx(ctx) {
					// The transaction is usable from the handler.
					var n int64
					return e.QueryRow(ctx, "SELECT count(*) FROM subscriber_checkpoints").Scan(&n)
				}
				return nil
			})
			run := start(t, sub)
			waitCaughtUp(t, sub)
			run.stop(t)
			want := []bool{true, true, true, true}
			if e.DB == nil {
				want = []bool{false, false, false, false}
			}
			require.Equal(t, want, rec.txSeen())
		})
	}
}

// TestSubscriberExactlyOnceWithFailingHandler: a handler that writes its
// projection through TxFromContext and then fails mid-batch leaves no trace
// of the failed batch; after a restart with a healthy handler every event
// is in the projection exactly once (the primary key on event_id would
// make any duplicate write fail). The handler writes through GORM
// (TxFromContext) or through database/sql (SQLTxFromContext), and on the
// pgx backend through pgxstore.TxFromContext; on Postgres (GORM) the
// catch-up batches take the pipelined path and the others the ordinary
// one.
func TestSubscriberExactlyOnceWithFailingHandler(t *testing.T) {
	t.Parallel()
	type backendProjector struct {
		b envBackend
		p projector
	}
	var runs []backendProjector
	for _, b := range append(gormEnvs(), gooseEnvBackends()...) {
		for _, p := range projectors {
			runs = append(runs, backendProjector{b, p})
		}
	}
	runs = append(runs, backendProjector{pgxBackend, pgxProjector})
	for _, r := range runs {
		b, p := r.b, r.p
		t.Run(b.Name+"/"+p.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			ctx := context.Background()
			table := coreProjection(t, e.DB, "exactly_once")
			const name = "core-exactly-once"
			appendN(t, e.Events, "core.once", 0, 30)
			feed := coreFeed(t, e.Events)
			ids := coreIDs(feed)

			var failures atomic.Int32
			failing := func(ctx context.Context, ev coreEnvelope) error {
				if err := p.Project(e, ctx, table, ev); err != nil {
					return err
				}
				if ev.ID == ids[15] {
					failures.Add(1)
					return errors.New("core: handler fails after writing") // the write above must vanish
				}
				return nil
			}
			logger, logs := newLogger()
			sub := coreNewSub(t, name, e.Events, e.Checkpoints, failing,
				subscriptions.WithBatchSize(10), subscriptions.WithLogger(logger))
			run := start(t, sub)
			// Batch 10..19 fails at 15, the events before it commit on their
			// own, then 15 keeps failing as the first of its batch.
			require.Eventually(t, func() bool { return failures.Load() >= 3 }, 30*time.Second, time.Millisecond)
			run.stop(t)

			pos, err := e.Checkpoints.Position(ctx, name)
			require.NoError(t, err)
			require.Equal(t, feed[14].Position, pos, "the checkpoint stops before the failing event")
			require.Equal(t, ids[:15], projected(t, e.DB, table), "the failed attempts left no trace")
			require.Contains(t, logs.String(), "processing the event failed")
			require.Contains(t, logs.String(), ids[15], "the log names the failing event")

			// Restart with the bug fixed, from a fresh checkpoint store.
			cps := e.freshCheckpoints(t)
			sub2 := coreNewSub(t, name, e.Events, cps, func(ctx context.Context, ev coreEnvelope) error {
				return p.Project(e, ctx, table, ev)
			}, subscriptions.WithBatchSize(10))
			run2 := start(t, sub2)
			waitCaughtUp(t, sub2)
			run2.stop(t)
			require.Equal(t, ids, projected(t, e.DB, table), "every event projected exactly once, in order")
		})
	}
}

// TestSubscriberDrainsOnShutdown: cancelling Run while a batch is in flight
// lets the batch finish and commit; Run returns nil and starts no new
// batch.
func TestSubscriberDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "core-drain"
			appendN(t, e.Events, "core.drain", 0, 25)
			feed := coreFeed(t, e.Events)
			var table string
			if e.DB != nil {
				table = coreProjection(t, e.DB, "drain")
			}
			gate := newCoreGate()
			defer gate.open()
			rec := &coreRecorder{}
			sub := coreNewSub(t, name, e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
				rec.record(ctx, ev)
				if ev.ID == feed[3].ID {
					gate.pass()
				}
				if table != "" {
					return e.project(ctx, table, ev)
				}
				return nil
			}, subscriptions.WithBatchSize(10))
			run := start(t, sub)
			gate.waitEntered(t)
			run.cancel()
			require.False(t, run.returned(), "Run returned while its batch was in flight")
			gate.open()
			res := run.wait(t)
			require.False(t, res.panicked)
			require.NoError(t, res.err, "a drained shutdown returns nil")

			require.Equal(t, coreIDs(feed[:10]), rec.ids(), "the in-flight batch finished, and no new one started")
			pos, err := e.Checkpoints.Position(ctx, name)
			require.NoError(t, err)
			require.Equal(t, feed[9].Position, pos, "the drained batch committed")
			if table != "" {
				require.Equal(t, coreIDs(feed[:10]), projected(t, e.DB, table))
			}
		})
	}
}

// TestSubscriberLag: 0 when caught up, head minus checkpoint otherwise,
// and an error wrapping ErrCheckpointAhead (not 0) past the head.
func TestSubscriberLag(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			sub := coreNewSub(t, "core-lag", e.Events, e.Checkpoints, func(context.Context, coreEnvelope) error { return nil })

			lag, err := sub.Lag(ctx)
			require.NoError(t, err)
			require.Zero(t, lag, "empty feed, fresh subscriber")

			appendN(t, e.Events, "core.lag", 0, 10)
			head, err := e.Events.HeadPosition(ctx)
			require.NoError(t, err)
			feed := coreFeed(t, e.Events)
			lag, err = sub.Lag(ctx)
			require.NoError(t, err)
			require.Equal(t, head, lag, "nothing processed yet")

			coreAdvance(t, e.Checkpoints, sub.Name(), feed[3].Position)
			lag, err = sub.Lag(ctx)
			require.NoError(t, err)
			require.Equal(t, head-feed[3].Position, lag)

			run := start(t, sub)
			waitCaughtUp(t, sub)
			run.stop(t)
			lag, err = sub.Lag(ctx)
			require.NoError(t, err)
			require.Zero(t, lag)

			// A checkpoint past the head (a truncated feed, a bad reset).
			coreAdvance(t, e.Checkpoints, sub.Name(), head+5)
			lag, err = sub.Lag(ctx)
			require.ErrorIs(t, err, subscriptions.ErrCheckpointAhead)
			require.Zero(t, lag)
			require.Contains(t, err.Error(), sub.Name())
		})
	}
}

// TestSubscriberPanicReleasesCheckpoint: a panicking handler releases the
// checkpoint (no leaked transaction, row lock or pooled connection; the
// next cycle can acquire) and the panic propagates out of Run.
func TestSubscriberPanicReleasesCheckpoint(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const name = "core-panic"
			appendN(t, e.Events, "core.panic", 0, 12)
			feed := coreFeed(t, e.Events)
			var table string
			if e.DB != nil {
				table = coreProjection(t, e.DB, "panic")
			}
			if e.Postgres() {
				// The probe sees a batch that is held open...
				batch, acquired, err := e.Checkpoints.Acquire(ctx, "core-probe")
				require.NoError(t, err)
				require.True(t, acquired)
				require.Equal(t, 1, coreIdleInTx(t, e.PG), "the idle-in-transaction probe must see an open batch")
				require.NoError(t, batch.Rollback())
				require.Zero(t, coreIdleInTx(t, e.PG))
			}

			type corePanic struct{ id string }
			sub := coreNewSub(t, name, e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
				if table != "" {
					if err := e.project(ctx, table, ev); err != nil {
						return err
					}
				}
				if ev.ID == feed[7].ID {
					panic(corePanic{ev.ID})
				}
				return nil
			}, subscriptions.WithBatchSize(5))
			run := start(t, sub)
			res := run.wait(t)
			require.True(t, res.panicked, "the panic must propagate out of Run (err %v)", res.err)
			require.Equal(t, corePanic{feed[7].ID}, res.panicVal)

			pos, err := e.Checkpoints.Position(ctx, name)
			require.NoError(t, err)
			require.Equal(t, feed[4].Position, pos, "the panicking batch did not commit")
			if e.DB != nil {
				require.Zero(t, e.inUse(t), "a connection of the pool is still checked out")
				require.Equal(t, coreIDs(feed[:5]), projected(t, e.DB, table), "the panicking batch's writes rolled back")
			}
			if e.Postgres() {
				require.Zero(t, coreIdleInTx(t, e.PG), "a batch transaction leaked")
			}
			batch, acquired, err := e.Checkpoints.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "the checkpoint must be released after a panic")
			require.Equal(t, feed[4].Position, batch.Position())
			require.NoError(t, batch.Rollback())

			// The next run picks up where the panic left off.
			sub2 := coreNewSub(t, name, e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
				if table != "" {
					return e.project(ctx, table, ev)
				}
				return nil
			}, subscriptions.WithBatchSize(5))
			run2 := start(t, sub2)
			waitCaughtUp(t, sub2)
			run2.stop(t)
			if table != "" {
				require.Equal(t, coreIDs(feed), projected(t, e.DB, table))
			}
		})
	}
}

// coreNoFeedStore is an event store without a global ordered feed.
type coreNoFeedStore struct {
	*infrastructure.MemoryStore
	headWorks bool // only ReadAfter reports the missing feed
}

func (s *coreNoFeedStore) ReadAfter(context.Context, int64, int) ([]domain.EventEnvelope[any], error) {
	return nil, fmt.Errorf("core fake store: read after: %w", domain.ErrGlobalOrderingNotSupported)
}

func (s *coreNoFeedStore) HeadPosition(ctx context.Context) (int64, error) {
	if s.headWorks {
		return s.MemoryStore.HeadPosition(ctx)
	}
	return 0, fmt.Errorf("core fake store: head: %w", domain.ErrGlobalOrderingNotSupported)
}

// TestSubscriberRunFailsFastWithoutGlobalFeed: Run returns an error
// wrapping ErrGlobalOrderingNotSupported on a store without a global feed.
func TestSubscriberRunFailsFastWithoutGlobalFeed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		headWorks bool
	}{
		{"head and feed unsupported", false},
		{"only the feed unsupported", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &coreNoFeedStore{MemoryStore: infrastructure.NewMemoryStore(), headWorks: tc.headWorks}
			appendN(t, store, "core.nofeed", 0, 3)
			var calls atomic.Int32
			sub := coreNewSub(t, "core-no-feed", store, subscriptions.NewMemoryCheckpointStore(),
				func(context.Context, coreEnvelope) error { calls.Add(1); return nil })
			res := start(t, sub).wait(t)
			require.False(t, res.panicked)
			require.ErrorIs(t, res.err, domain.ErrGlobalOrderingNotSupported)
			require.Contains(t, res.err.Error(), "core-no-feed")
			require.Zero(t, calls.Load())
		})
	}
}

// coreFlakyStore's ReadAfter and HeadPosition fail a number of times
// before working, like a database having a hiccup.
type coreFlakyStore struct {
	*infrastructure.MemoryStore
	headFails, readFails atomic.Int32
}

func (s *coreFlakyStore) ReadAfter(ctx context.Context, after int64, limit int) ([]domain.EventEnvelope[any], error) {
	if s.readFails.Add(-1) >= 0 {
		return nil, errors.New("core fake store: connection reset by peer")
	}
	return s.MemoryStore.ReadAfter(ctx, after, limit)
}

func (s *coreFlakyStore) HeadPosition(ctx context.Context) (int64, error) {
	if s.headFails.Add(-1) >= 0 {
		return 0, errors.New("core fake store: head: connection refused")
	}
	return s.MemoryStore.HeadPosition(ctx)
}

// coreFlakyCheckpoints wraps a checkpoint store whose Position, Acquire
// and Commit fail a number of times before working.
type coreFlakyCheckpoints struct {
	subscriptions.CheckpointStore
	positionFails, acquireFails, commitFails atomic.Int32
}

func (c *coreFlakyCheckpoints) Position(ctx context.Context, name string) (int64, error) {
	if c.positionFails.Add(-1) >= 0 {
		return 0, errors.New("core fake checkpoints: position: i/o timeout")
	}
	return c.CheckpointStore.Position(ctx, name)
}

func (c *coreFlakyCheckpoints) Acquire(ctx context.Context, name string) (subscriptions.Batch, bool, error) {
	if c.acquireFails.Add(-1) >= 0 {
		return nil, false, errors.New("core fake checkpoints: acquire: too many connections")
	}
	batch, ok, err := c.CheckpointStore.Acquire(ctx, name)
	if err != nil || !ok {
		return batch, ok, err
	}
	return &coreFlakyBatch{Batch: batch, parent: c}, true, nil
}

type coreFlakyBatch struct {
	subscriptions.Batch
	parent *coreFlakyCheckpoints
}

func (b *coreFlakyBatch) Commit(ctx context.Context, position int64) error {
	if b.parent.commitFails.Add(-1) >= 0 {
		// A failed commit loses the batch, as a database's would.
		_ = b.Batch.Rollback()
		return errors.New("core fake checkpoints: commit: server closed the connection")
	}
	return b.Batch.Commit(ctx, position)
}

// TestSubscriberTransientErrorsAreRetried: failing feed reads and
// checkpoint operations are logged and retried, never fatal; every event
// is eventually handled, in order.
func TestSubscriberTransientErrorsAreRetried(t *testing.T) {
	t.Parallel()
	t.Run("feed", func(t *testing.T) {
		store := &coreFlakyStore{MemoryStore: infrastructure.NewMemoryStore()}
		store.headFails.Store(1)
		store.readFails.Store(3)
		appendN(t, store.MemoryStore, "core.flaky", 0, 12)
		rec := &coreRecorder{}
		logger, logs := newLogger()
		sub := coreNewSub(t, "core-flaky-feed", store, subscriptions.NewMemoryCheckpointStore(),
			func(ctx context.Context, ev coreEnvelope) error { rec.record(ctx, ev); return nil },
			subscriptions.WithLogger(logger), subscriptions.WithBatchSize(5))
		run := start(t, sub)
		// Not waitCaughtUp: Lag would consume the head failure meant for Run.
		require.Eventually(t, func() bool { return rec.len() >= 12 }, 30*time.Second, time.Millisecond)
		require.False(t, run.returned(), "a transient error must not stop Run")
		run.stop(t)
		require.Equal(t, coreIDs(coreFeed(t, store.MemoryStore)), rec.ids())
		out := logs.String()
		require.Equal(t, 1, strings.Count(out, "reading the feed head failed; will retry"), out)
		require.Equal(t, 3, strings.Count(out, "reading the feed failed; will retry"), out)
		require.Contains(t, out, "connection reset by peer")
		require.Contains(t, out, "core-flaky-feed")
	})

	for _, b := range envBackends() {
		t.Run("checkpoints/"+b.Name, func(t *testing.T) {
			e := b.New(t)
			appendN(t, e.Events, "core.flaky", 0, 20)
			feed := coreFeed(t, e.Events)
			var table string
			if e.DB != nil {
				table = coreProjection(t, e.DB, "flaky")
			}
			cps := &coreFlakyCheckpoints{CheckpointStore: e.Checkpoints}
			cps.positionFails.Store(1)
			cps.acquireFails.Store(2)
			cps.commitFails.Store(1)
			rec := &coreRecorder{}
			logger, logs := newLogger()
			sub := coreNewSub(t, "core-flaky-checkpoints", e.Events, cps, func(ctx context.Context, ev coreEnvelope) error {
				rec.record(ctx, ev)
				if table != "" {
					return e.project(ctx, table, ev)
				}
				return nil
			}, subscriptions.WithLogger(logger), subscriptions.WithBatchSize(10))
			run := start(t, sub)
			require.Eventually(t, func() bool {
				pos, err := e.Checkpoints.Position(context.Background(), sub.Name())
				return err == nil && pos == feed[19].Position
			}, 30*time.Second, 5*time.Millisecond)
			require.False(t, run.returned(), "a transient error must not stop Run")
			run.stop(t)

			// The batch whose commit failed was redelivered (at-least-once)...
			ids := coreIDs(feed)
			want := append(append(append([]string(nil), ids[:10]...), ids[:10]...), ids[10:]...)
			require.Equal(t, want, rec.ids())
			// ...and its transactional writes were not kept twice.
			if table != "" {
				require.Equal(t, ids, projected(t, e.DB, table))
			}
			out := logs.String()
			require.Equal(t, 1, strings.Count(out, "reading the checkpoint failed; will retry"), out)
			require.Equal(t, 2, strings.Count(out, "acquiring the checkpoint failed; will retry"), out)
			require.Equal(t, 1, strings.Count(out, "committing the batch failed; will retry"), out)
			require.Contains(t, out, "too many connections")
		})
	}
}

// catchUpFailingCheckpoints is a checkpoint store whose catch-up mark
// cannot be recorded, like a database that refuses the first start's
// write: Run stays in its start, retrying.
type catchUpFailingCheckpoints struct {
	*subscriptions.MemoryCheckpointStore
	calls atomic.Int32
}

func (c *catchUpFailingCheckpoints) StartCatchUp(context.Context, string, []string, int64) error {
	c.calls.Add(1)
	return errors.New("core fake checkpoints: catch-up: read-only transaction")
}

// TestStartingRunIsRunning: a Run still retrying its start (here the
// first start's catch-up mark, as a database that does not answer yet)
// is reported running, never "not running in this process": a readiness
// probe sent then must not tell the operator the process runs nothing.
// Once Run returns it is stopped again.
func TestStartingRunIsRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, parts := range []int{0, 3} {
		t.Run(fmt.Sprintf("partitions=%d", parts), func(t *testing.T) {
			t.Parallel()
			store := infrastructure.NewMemoryStore()
			appendN(t, store, "core.start", 0, 5)
			cps := &catchUpFailingCheckpoints{MemoryCheckpointStore: subscriptions.NewMemoryCheckpointStore()}
			opts := []subscriptions.SubscriberOption{subscriptions.WithLogger(quietLogger()),
				subscriptions.WithPollInterval(5 * time.Millisecond), subscriptions.WithFirstRunCatchUp(1)}
			if parts > 0 {
				opts = append(opts, subscriptions.WithPartitions(parts))
			}
			sub := coreNewSub(t, "core-starting", store, cps,
				func(context.Context, coreEnvelope) error { return nil }, opts...)
			st, err := sub.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, subscriptions.StateStopped, st.State, "before Run")

			run := start(t, sub)
			require.Eventually(t, func() bool { return cps.calls.Load() >= 3 }, 30*time.Second, time.Millisecond,
				"Run retries its start")
			st, err = sub.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, subscriptions.StateRunning, st.State, "a starting Run")
			require.NotErrorIs(t, sub.Healthy(ctx), subscriptions.ErrSubscriberStopped)
			require.False(t, run.returned())

			run.stop(t)
			st, err = sub.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, subscriptions.StateStopped, st.State, "after Run returned")
			require.ErrorIs(t, sub.Healthy(ctx), subscriptions.ErrSubscriberStopped)
		})
	}
}

// TestNewSubscriberValidation: every out-of-range argument is rejected with
// an error naming it.
func TestNewSubscriberValidation(t *testing.T) {
	t.Parallel()
	store := infrastructure.NewMemoryStore()
	cps := subscriptions.NewMemoryCheckpointStore()
	noop := func(context.Context, coreEnvelope) error { return nil }
	var nilStore *infrastructure.MemoryStore
	var nilCheckpoints *subscriptions.MemoryCheckpointStore
	type args struct {
		name    string
		events  domain.EventStore
		cps     subscriptions.CheckpointStore
		handler subscriptions.Handler
		opts    []subscriptions.SubscriberOption
	}
	valid := func() args { return args{"core-valid", store, cps, noop, nil} }
	cases := []struct {
		name   string
		mutate func(*args)
		want   string // the argument the error must name
	}{
		{"empty name", func(a *args) { a.name = "" }, "name"},
		{"overlong name", func(a *args) { a.name = strings.Repeat("n", subscriptions.MaxSubscriberNameBytes+1) }, "name"},
		{"invalid UTF-8 name", func(a *args) { a.name = "bad\xffname" }, "name"},
		{"nil store", func(a *args) { a.events = nil }, "events"},
		{"typed nil store", func(a *args) { a.events = nilStore }, "events"},
		{"nil checkpoint store", func(a *args) { a.cps = nil }, "checkpoints"},
		{"typed nil checkpoint store", func(a *args) { a.cps = nilCheckpoints }, "checkpoints"},
		{"nil handler", func(a *args) { a.handler = nil }, "handler"},
		{"zero batch size", func(a *args) { a.opts = append(a.opts, subscriptions.WithBatchSize(0)) }, "WithBatchSize"},
		{"negative batch size", func(a *args) { a.opts = append(a.opts, subscriptions.WithBatchSize(-3)) }, "WithBatchSize"},
		{"zero poll interval", func(a *args) { a.opts = append(a.opts, subscriptions.WithPollInterval(0)) }, "WithPollInterval"},
		{"negative poll interval", func(a *args) { a.opts = append(a.opts, subscriptions.WithPollInterval(-time.Second)) }, "WithPollInterval"},
		{"negative max retries", func(a *args) { a.opts = append(a.opts, subscriptions.WithMaxRetries(-1)) }, "WithMaxRetries"},
		{"zero initial backoff", func(a *args) { a.opts = append(a.opts, subscriptions.WithRetryBackoff(0, time.Second)) }, "WithRetryBackoff"},
		{"negative initial backoff", func(a *args) {
			a.opts = append(a.opts, subscriptions.WithRetryBackoff(-time.Millisecond, time.Second))
		}, "WithRetryBackoff"},
		{"maximum below initial", func(a *args) {
			a.opts = append(a.opts, subscriptions.WithRetryBackoff(2*time.Second, time.Second))
		}, "WithRetryBackoff"},
		{"negative handler timeout", func(a *args) {
			a.opts = append(a.opts, subscriptions.WithHandlerTimeout(-time.Second))
		}, "WithHandlerTimeout"},
		{"negative shutdown grace", func(a *args) {
			a.opts = append(a.opts, subscriptions.WithShutdownGrace(-time.Second))
		}, "WithShutdownGrace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := valid()
			tc.mutate(&a)
			sub, err := subscriptions.NewSubscriber(a.name, a.events, a.cps, a.handler, a.opts...)
			require.Error(t, err)
			require.Nil(t, sub)
			require.Contains(t, err.Error(), tc.want)
		})
	}

	t.Run("valid", func(t *testing.T) {
		a := valid()
		sub, err := subscriptions.NewSubscriber(a.name, a.events, a.cps, a.handler,
			subscriptions.WithBatchSize(1), subscriptions.WithPollInterval(time.Nanosecond), subscriptions.WithMaxRetries(0),
			subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond), subscriptions.WithLogger(nil), nil)
		require.NoError(t, err)
		require.Equal(t, "core-valid", sub.Name())
	})

	t.Run("negative reset", func(t *testing.T) {
		ctx := context.Background()
		sub, err := subscriptions.NewSubscriber("core-negative-reset", store, cps, noop, subscriptions.WithLogger(quietLogger()))
		require.NoError(t, err)
		require.NoError(t, sub.ResetCheckpoint(ctx, 4))
		err = sub.ResetCheckpoint(ctx, -1)
		require.Error(t, err)
		require.Contains(t, err.Error(), "-1")
		pos, err := cps.Position(ctx, "core-negative-reset")
		require.NoError(t, err)
		require.EqualValues(t, 4, pos, "a refused reset changes nothing")
	})
}

type coreUserCreated struct {
	Name string `json:"name"`
	Age  int    `json:"age"`
}

type coreOrderPlaced struct {
	OrderID string  `json:"order_id"`
	Total   float64 `json:"total"`
}

// TestSubscriberWithEventDispatcher: EventDispatcher.Dispatch wired as the
// Handler routes events to typed handlers, decoding payloads read back from
// a database into the handler's type, with the batch transaction in
// context.
func TestSubscriberWithEventDispatcher(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			for _, ev := range []domain.EventEnvelope[any]{
				domain.NewEventEnvelope[any](coreUserCreated{Name: "alice", Age: 30}, "user-1", "user.created", 0),
				domain.NewEventEnvelope[any](coreOrderPlaced{OrderID: "o-1", Total: 9.5}, "order-1", "order.placed", 0),
				domain.NewEventEnvelope[any](map[string]any{"reason": "gdpr"}, "user-1", "user.deleted", 0),
				domain.NewEventEnvelope[any](coreUserCreated{Name: "bob", Age: 41}, "user-2", "user.created", 0),
			} {
				require.NoError(t, e.Events.Append(ctx, ev.AggregateID, -1, ev))
			}
			feed := coreFeed(t, e.Events)

			var mu sync.Mutex
			var users []coreUserCreated
			var orders []coreOrderPlaced
			var userEvents, all []string
			var txMissing int
			checkTx := func(ctx context.Context) {
				if e.InTx(ctx) != (e.DB != nil) {
					txMissing++
				}
			}
			d := domain.NewEventDispatcher()
			require.NoError(t, domain.Subscribe(d, "user.created", func(ctx context.Context, ev domain.EventEnvelope[coreUserCreated]) error {
				mu.Lock()
				defer mu.Unlock()
				checkTx(ctx)
				users = append(users, ev.Payload)
				return nil
			}))
			require.NoError(t, domain.Subscribe(d, "order.placed", func(ctx context.Context, ev domain.EventEnvelope[coreOrderPlaced]) error {
				mu.Lock()
				defer mu.Unlock()
				checkTx(ctx)
				orders = append(orders, ev.Payload)
				return nil
			}))
			require.NoError(t, domain.Subscribe(d, "user.*", func(ctx context.Context, ev domain.EventEnvelope[map[string]any]) error {
				mu.Lock()
				defer mu.Unlock()
				userEvents = append(userEvents, ev.EventType)
				return nil
			}))
			require.NoError(t, d.SubscribeWildcard(func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				mu.Lock()
				defer mu.Unlock()
				checkTx(ctx)
				all = append(all, ev.ID)
				return nil
			}))

			sub := coreNewSub(t, "core-dispatch", e.Events, e.Checkpoints, d.Dispatch)
			run := start(t, sub)
			waitCaughtUp(t, sub)
			run.stop(t)

			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []coreUserCreated{{"alice", 30}, {"bob", 41}}, users)
			require.Equal(t, []coreOrderPlaced{{"o-1", 9.5}}, orders)
			require.Equal(t, []string{"user.created", "user.deleted", "user.created"}, userEvents)
			require.Equal(t, coreIDs(feed), all)
			require.Zero(t, txMissing, "handlers must see the batch transaction exactly on database backends")
		})
	}
}

// TestSubscriberSurvivesTerminatedConnections: real database errors — the
// server terminating the subscriber's connections, one of them in the
// middle of a batch — are logged and retried, never fatal, and the
// projection still ends up with every event exactly once.
func TestSubscriberSurvivesTerminatedConnections(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	app := "core_victim_" + pg.Schema
	db := dbtest.OpenPostgresDSN(t, pg.DSN+"&application_name="+app)
	e := gormEnv(t, "postgres", db, pg)
	table := coreProjection(t, pg.DB, "terminated")
	appendN(t, e.Events, "core.terminated", 0, 30)
	feed := coreFeed(t, e.Events)
	ids := coreIDs(feed)

	gate := newCoreGate()
	defer gate.open()
	var gated atomic.Bool
	logger, logs := newLogger()
	sub := coreNewSub(t, "core-terminated", e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
		if err := project(ctx, table, ev); err != nil {
			return err
		}
		if ev.ID == ids[12] && gated.CompareAndSwap(false, true) {
			gate.pass()
		}
		return nil
	}, subscriptions.WithBatchSize(10), subscriptions.WithLogger(logger))
	run := start(t, sub)
	gate.waitEntered(t) // the batch of events 10..19 holds a transaction

	terminate := func() int {
		var killed []bool
		require.NoError(t, pg.DB.Raw("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ?", app).Scan(&killed).Error)
		return len(killed)
	}
	require.Positive(t, terminate(), "the subscriber's connections should be visible")
	gate.open()

	require.Eventually(t, func() bool {
		var n int64
		return pg.DB.Raw("SELECT count(*) FROM "+table).Scan(&n).Error == nil && n == int64(len(ids))
	}, 30*time.Second, 5*time.Millisecond)
	// Once more while idle, then new events still get through.
	terminate()
	other, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	more := appendN(t, other, "core.terminated", 30, 5)
	require.Eventually(t, func() bool {
		var n int64
		return pg.DB.Raw("SELECT count(*) FROM "+table).Scan(&n).Error == nil && n == int64(len(ids)+len(more))
	}, 30*time.Second, 5*time.Millisecond)
	require.False(t, run.returned(), "database errors must not stop Run")
	run.stop(t)

	require.Equal(t, append(ids, more...), projected(t, pg.DB, table), "every event exactly once, in order")
	require.Contains(t, logs.String(), "level=ERROR", "the failures must be logged")
	t.Logf("logged errors:\n%s", coreLines(logs.String(), "level=ERROR"))
}

// coreLines returns the lines of s that contain substr.
func coreLines(s, substr string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestSubscriberLogsMidBatchHandlerFailure: a handler failure is logged
// even when it hits an event in the middle of a batch and the event then
// succeeds when it is run again.
func TestSubscriberLogsMidBatchHandlerFailure(t *testing.T) {
	t.Parallel()
	store := infrastructure.NewMemoryStore()
	ids := appendN(t, store, "core.glitch", 0, 10)
	var failed atomic.Bool
	rec := &coreRecorder{}
	logger, logs := newLogger()
	sub := coreNewSub(t, "core-glitch", store, subscriptions.NewMemoryCheckpointStore(), func(ctx context.Context, ev coreEnvelope) error {
		if ev.ID == ids[5] && failed.CompareAndSwap(false, true) {
			return errors.New("core transient glitch")
		}
		rec.record(ctx, ev)
		return nil
	}, subscriptions.WithBatchSize(10), subscriptions.WithLogger(logger))
	run := start(t, sub)
	waitCaughtUp(t, sub)
	run.stop(t)
	// The events before the failing one were redelivered (at-least-once).
	want := append(append(append([]string(nil), ids[:5]...), ids[:5]...), ids[5:]...)
	require.Equal(t, want, rec.ids())
	require.True(t, failed.Load())
	require.Contains(t, logs.String(), "core transient glitch", "the handler failure must be logged")
}
