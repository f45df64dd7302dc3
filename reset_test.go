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
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
)

// TestCheckpointStoreResetThenAcquire: a reset checkpoint is acquired at
// the reset position by the same store, and can be reset again.
func TestCheckpointStoreResetThenAcquire(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			cps := e.Checkpoints
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			const name = "reset-then-acquire"
			require.NoError(t, cps.Reset(ctx, name, 5))
			batch, acquired, err := cps.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "the checkpoint must be acquirable after a Reset")
			require.EqualValues(t, 5, batch.Position())
			require.NoError(t, batch.Commit(ctx, 6))

			require.NoError(t, cps.Reset(ctx, name, 2), "a second Reset must not hang")
			require.NoError(t, cps.Reset(ctx, name, 3))
			pos, err := cps.Position(ctx, name)
			require.NoError(t, err)
			require.EqualValues(t, 3, pos)
			batch, acquired, err = cps.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired)
			require.EqualValues(t, 3, batch.Position())
			require.NoError(t, batch.Rollback())
		})
	}
}

// TestCheckpointStoreResetDuringBatch: a Reset racing an in-flight batch
// is never overwritten. Postgres: Reset waits for the batch. SQLite: Reset
// returns at once, even from the goroutine holding the batch, and the
// batch's Commit fails with ErrCheckpointMoved. Memory: Reset fails with
// ErrBatchInFlight.
func TestCheckpointStoreResetDuringBatch(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			cps := e.Checkpoints
			ctx := context.Background()
			const name = "reset-during-batch"
			coreAdvance(t, cps, name, 3)
			batch, acquired, err := cps.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired)

			if e.DB == nil {
				require.ErrorIs(t, cps.Reset(ctx, name, 1), subscriptions.ErrBatchInFlight)
				require.NoError(t, batch.Commit(ctx, 8))
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 8, pos)
				require.NoError(t, cps.Reset(ctx, name, 1), "Reset succeeds once the batch is over")
				pos, err = cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 1, pos)
				return
			}

			if !e.Postgres() {
				// The original module's sequence, from one goroutine: the
				// Reset must not wait for the batch (that would hang here), and
				// the batch's Commit must fail.
				rctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				require.NoError(t, cps.Reset(rctx, name, 1), "Reset while this goroutine holds the batch")
				err := batch.Commit(ctx, 8)
				require.ErrorIs(t, err, subscriptions.ErrCheckpointMoved, "on SQLite the batch's Commit must detect the reset")
				require.ErrorIs(t, batch.Rollback(), subscriptions.ErrBatchFinished)
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 1, pos, "the reset must win")
				batch, acquired, err = cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.EqualValues(t, 1, batch.Position())
				require.NoError(t, batch.Rollback())
				return
			}
			resetDone := make(chan error, 1)
			go func() { resetDone <- cps.Reset(ctx, name, 1) }()
			{
				require.Eventually(t, func() bool { return coreLockWaiters(t, e.PG) > 0 }, 20*time.Second, 5*time.Millisecond,
					"Reset should queue behind the batch's row lock")
				select {
				case err := <-resetDone:
					t.Fatalf("Reset returned (%v) while the batch held the checkpoint", err)
				default:
				}
				require.NoError(t, batch.Commit(ctx, 8), "on Postgres the batch commits and the reset follows")
			}
			select {
			case err := <-resetDone:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("Reset did not return after the batch ended")
			}
			pos, err := cps.Position(ctx, name)
			require.NoError(t, err)
			require.EqualValues(t, 1, pos, "the reset must win")

			batch, acquired, err = cps.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired)
			require.EqualValues(t, 1, batch.Position())
			require.NoError(t, batch.Rollback())
		})
	}
}

// coreCountProjection creates a projection that counts how often each
// event was committed into it.
func coreCountProjection(t *testing.T, db *gorm.DB) string {
	t.Helper()
	const table = "core_counts"
	require.NoError(t, db.Exec("CREATE TABLE "+table+" (event_id text PRIMARY KEY, position bigint NOT NULL, times integer NOT NULL)").Error)
	return table
}

func coreCountEvent(ctx context.Context, e *env, table string, ev coreEnvelope) error {
	return e.Exec(ctx, "INSERT INTO "+table+" (event_id, position, times) VALUES (?, ?, 1) ON CONFLICT (event_id) DO UPDATE SET times = "+table+".times + 1",
		ev.ID, ev.Position)
}

func coreCounts(t *testing.T, db *gorm.DB, table string) map[string]int {
	t.Helper()
	var rows []struct {
		EventID string
		Times   int
	}
	require.NoError(t, db.Raw("SELECT event_id, times FROM "+table).Scan(&rows).Error)
	out := make(map[string]int, len(rows))
	for _, r := range rows {
		out[r.EventID] = r.Times
	}
	return out
}

// TestSubscriberResetWhileBatchInFlight resets a running subscriber while
// its batch is in flight: the reset is never overwritten, and the
// subscriber resumes from the reset position.
func TestSubscriberResetWhileBatchInFlight(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			appendN(t, e.Events, "core.reset", 0, 30)
			feed := coreFeed(t, e.Events)
			ids, pos := coreIDs(feed), corePositions(feed)
			var table string
			if e.DB != nil {
				table = coreCountProjection(t, e.DB)
			}

			gate := newCoreGate()
			defer gate.open()
			var gated atomic.Bool
			rec := &coreRecorder{}
			handler := func(ctx context.Context, ev coreEnvelope) error {
				rec.record(ctx, ev)
				if table != "" {
					if err := coreCountEvent(ctx, e, table, ev); err != nil {
						return err
					}
				}
				if ev.ID == ids[14] && gated.CompareAndSwap(false, true) {
					gate.pass()
				}
				return nil
			}
			logger, logs := newLogger()
			sub := coreNewSub(t, "core-reset-in-flight", e.Events, e.Checkpoints, handler,
				subscriptions.WithBatchSize(10), subscriptions.WithLogger(logger))
			run := start(t, sub)
			gate.waitEntered(t) // the batch of events 10..19 is in flight

			// k is how many events were handled before the replay from the
			// reset position (events 5.. again) started.
			var k int
			switch {
			case e.DB == nil:
				err := sub.ResetCheckpoint(ctx, pos[4])
				require.ErrorIs(t, err, subscriptions.ErrBatchInFlight)
				gate.open()
				waitCaughtUp(t, sub)
				require.Equal(t, ids, rec.ids(), "the refused reset must not have changed anything")
				var lastErr error
				require.Eventually(t, func() bool {
					lastErr = sub.ResetCheckpoint(ctx, pos[4])
					return lastErr == nil || !errors.Is(lastErr, subscriptions.ErrBatchInFlight)
				}, 20*time.Second, time.Millisecond)
				require.NoError(t, lastErr)
				k = 30
			case e.Postgres():
				resetDone := make(chan error, 1)
				go func() { resetDone <- sub.ResetCheckpoint(ctx, pos[4]) }()
				require.Eventually(t, func() bool { return coreLockWaiters(t, e.PG) > 0 }, 20*time.Second, 5*time.Millisecond,
					"ResetCheckpoint should wait for the batch")
				require.Len(t, resetDone, 0, "ResetCheckpoint returned while the batch was in flight")
				gate.open()
				require.NoError(t, <-resetDone)
				// The subscriber may or may not have squeezed in the next batch
				// (events 20..29) between the batch's commit and the reset.
				k = -1
			default: // SQLite
				// The reset aborts the batch (blocked in event 14's handler) and
				// returns without waiting for it; the handler's next statement
				// (event 15's) then fails and the batch is discarded.
				rctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				require.NoError(t, sub.ResetCheckpoint(rctx, pos[4]), "ResetCheckpoint while the batch is in flight")
				gate.open()
				require.Eventually(t, func() bool {
					return strings.Count(logs.String(), "checkpoint was reset during the batch; batch discarded") == 1
				}, 30*time.Second, 5*time.Millisecond, "the in-flight batch must be discarded")
				k = 16
			}

			// The replay from the reset position runs to the end.
			require.Eventually(t, func() bool {
				got := rec.ids()
				if len(got) < 41 {
					return false
				}
				p, err := e.Checkpoints.Position(ctx, sub.Name())
				return err == nil && p == pos[29] && fmt.Sprint(got[len(got)-25:]) == fmt.Sprint(ids[5:])
			}, 30*time.Second, 5*time.Millisecond, "the subscriber did not replay from the reset position")
			run.stop(t)

			got := rec.ids()
			if k < 0 {
				k = len(got) - 25
				require.Contains(t, []int{20, 30}, k)
			}
			want := append(append([]string(nil), ids[:k]...), ids[5:]...)
			require.Equal(t, want, got)

			if table != "" {
				// Committed writes: every handling, except the SQLite batch
				// that the reset aborted.
				wantCounts := map[string]int{}
				for _, id := range got {
					wantCounts[id]++
				}
				if !e.Postgres() {
					for _, id := range ids[10:16] {
						wantCounts[id]--
					}
				}
				require.Equal(t, wantCounts, coreCounts(t, e.DB, table))
			}
		})
	}
}

// TestSubscriberResetRebuildsProjection: truncating a projection and
// resetting to 0 while the subscriber runs re-projects every event exactly
// once, incrementally (a stop midway leaves a consistent prefix) and
// resumably (a new subscriber finishes the rebuild).
func TestSubscriberResetRebuildsProjection(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			appendN(t, e.Events, "core.rebuild", 0, 40)
			feed := coreFeed(t, e.Events)
			ids, pos := coreIDs(feed), corePositions(feed)

			// The projection: a table keyed by event ID, or in memory a set
			// that refuses duplicates the same way.
			var table string
			var memMu sync.Mutex
			mem := map[string]int64{}
			if e.DB != nil {
				table = coreProjection(t, e.DB, "rebuild")
			}
			write := func(ctx context.Context, ev coreEnvelope) error {
				if table != "" {
					return e.project(ctx, table, ev)
				}
				memMu.Lock()
				defer memMu.Unlock()
				if _, dup := mem[ev.ID]; dup {
					return fmt.Errorf("duplicate %s", ev.ID)
				}
				mem[ev.ID] = ev.Position
				return nil
			}
			read := func() []string {
				if table != "" {
					return projected(t, e.DB, table)
				}
				memMu.Lock()
				defer memMu.Unlock()
				out := []string{}
				for _, id := range ids {
					if _, ok := mem[id]; ok {
						out = append(out, id)
					}
				}
				require.Len(t, out, len(mem))
				return out
			}
			truncate := func() {
				if table != "" {
					require.NoError(t, e.DB.Exec("DELETE FROM "+table).Error)
					return
				}
				memMu.Lock()
				defer memMu.Unlock()
				clear(mem)
			}

			gate := newCoreGate()
			defer gate.open()
			var rebuilding, gated atomic.Bool
			handler := func(ctx context.Context, ev coreEnvelope) error {
				if err := write(ctx, ev); err != nil {
					return err
				}
				if rebuilding.Load() && ev.ID == ids[20] && gated.CompareAndSwap(false, true) {
					gate.pass()
				}
				return nil
			}
			const name = "core-rebuild"
			sub := coreNewSub(t, name, e.Events, e.Checkpoints, handler, subscriptions.WithBatchSize(7))
			run := start(t, sub)
			waitCaughtUp(t, sub)
			require.Equal(t, ids, read())

			// Rebuild while running.
			truncate()
			rebuilding.Store(true)
			require.NoError(t, sub.ResetCheckpoint(ctx, 0))
			gate.waitEntered(t)
			// Stop midway: the batch of events 14..20 drains and commits.
			run.cancel()
			gate.open()
			require.NoError(t, run.wait(t).err)
			p, err := e.Checkpoints.Position(ctx, name)
			require.NoError(t, err)
			require.Equal(t, pos[20], p, "the rebuild stopped after the drained batch")
			require.Equal(t, ids[:21], read(), "the projection is consistent with the checkpoint")

			// A new subscriber (as after a restart) finishes the rebuild.
			cps := e.Checkpoints
			if e.DB != nil {
				cps = e.freshCheckpoints(t)
			}
			sub2 := coreNewSub(t, name, e.Events, cps, handler, subscriptions.WithBatchSize(7))
			run2 := start(t, sub2)
			waitCaughtUp(t, sub2)
			run2.stop(t)
			require.Equal(t, ids, read(), "every event re-projected exactly once")
		})
	}
}
