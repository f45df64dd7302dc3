package sqlitequeue

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestForOneQueuePerFile: every store on one file shares a queue; other
// files and private in-memory databases have their own.
func TestForOneQueuePerFile(t *testing.T) {
	dir := t.TempDir()
	a := For(filepath.Join(dir, "a.db"))
	require.Same(t, a, For(filepath.Join(dir, "a.db")))
	require.NotSame(t, a, For(filepath.Join(dir, "b.db")))
	require.NotSame(t, For(""), For(""))
}

// TestQueueMovingNeverFails: 8 writers take 40 turns each, each turn
// longer than a tenth of the patience, so that a writer waits in all for
// many times its patience: none fails while the queue moves, and no two
// hold a turn at once.
func TestQueueMovingNeverFails(t *testing.T) {
	q := For(filepath.Join(t.TempDir(), "a.db"))
	const patience = 50 * time.Millisecond
	var holders, maxHolders atomic.Int32
	var turns atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for range 40 {
				done, err := q.Wait(context.Background(), patience)
				if err != nil {
					errs <- err
					return
				}
				n := holders.Add(1)
				for m := maxHolders.Load(); n > m && !maxHolders.CompareAndSwap(m, n); m = maxHolders.Load() {
				}
				time.Sleep(patience / 8) // the turn's work
				holders.Add(-1)
				turns.Add(1)
				done()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 8*40, turns.Load())
	require.EqualValues(t, 1, maxHolders.Load(), "one turn at a time")
	require.Greater(t, time.Since(start), 8*patience, "some writer waited longer than its patience")
}

// TestQueueStalledFails: a turn that does not end fails the waiters
// behind it after their patience, with SQLite's "database is locked";
// once it ends the next waiter gets its turn at once.
func TestQueueStalledFails(t *testing.T) {
	q := For(filepath.Join(t.TempDir(), "a.db"))
	done, err := q.Wait(context.Background(), time.Second)
	require.NoError(t, err)
	_, err = q.Wait(context.Background(), 20*time.Millisecond)
	require.ErrorContains(t, err, "database is locked")
	done()
	done, err = q.Wait(context.Background(), 20*time.Millisecond)
	require.NoError(t, err)
	done()
}

// TestQueueContext: a waiter leaves at its context's end, with its cause;
// without patience (0) only the context ends the wait.
func TestQueueContext(t *testing.T) {
	q := For(filepath.Join(t.TempDir(), "a.db"))
	done, err := q.Wait(context.Background(), 0)
	require.NoError(t, err)
	defer done()
	cause := errors.New("request gone")
	ctx, cancel := context.WithCancelCause(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := q.Wait(ctx, 0)
		waited <- err
	}()
	select {
	case err := <-waited:
		t.Fatalf("a waiter without patience returned before its context ended: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel(cause)
	require.ErrorIs(t, <-waited, cause)
}
