package feedtest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// Async runs f on a goroutine of its own; its error arrives on the
// returned channel, which Result and Finished read.
func Async(f func() error) chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

// Result waits for an asynchronous operation's error, failing the test
// if it has not finished by the test context's deadline. Call it on the
// test's goroutine.
func Result(t testing.TB, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-Context(t).Done():
		t.Fatalf("%s did not finish", what)
		return nil
	}
}

// Finished reports whether the operation has already finished, without
// waiting; its error, if any, is put back for Result.
func Finished(done chan error) bool {
	select {
	case err := <-done:
		done <- err
		return true
	default:
		return false
	}
}

// WaitNoErrors waits for wg's goroutines, which report failures on errs,
// then closes errs and fails the test on the first error it holds.
func WaitNoErrors(t testing.TB, wg *sync.WaitGroup, errs chan error) {
	t.Helper()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// Eventually polls cond until it holds, failing the test at the test
// context's deadline. It is how a test waits for another goroutine or
// connection to reach a state, never with a bare sleep. Call it on the
// test's goroutine.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx := Context(t)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-tick.C:
		}
	}
}

// Watcher reads the whole feed in a loop on its own goroutine and records
// every answer, so that a test can check that no read, at any moment, ever
// saw a position before a smaller one became visible.
type Watcher struct {
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	reads [][]string
	err   error
}

// WatchFeed starts a Watcher on s. It stops at Finish or, at the latest,
// at the test's cleanup, so that a test that fails early does not leak it.
func WatchFeed(t testing.TB, s domain.EventStore) *Watcher {
	ctx := Context(t) // registered first, so canceled after halt
	w := &Watcher{stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(w.halt)
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			feed, err := s.ReadAfter(ctx, 0, 0)
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.reads = append(w.reads, IDs(feed))
			w.mu.Unlock()
		}
	}()
	return w
}

// Count is the number of reads made so far.
func (w *Watcher) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.reads)
}

// Last is the latest read's IDs, nil before the first.
func (w *Watcher) Last() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.reads) == 0 {
		return nil
	}
	return w.reads[len(w.reads)-1]
}

func (w *Watcher) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// Finish stops the watcher and returns every read it made, failing the
// test if a read failed.
func (w *Watcher) Finish(t testing.TB) [][]string {
	t.Helper()
	w.halt()
	require.NoError(t, w.err)
	return w.reads
}
