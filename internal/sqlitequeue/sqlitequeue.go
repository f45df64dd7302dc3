// Package sqlitequeue lets the module's writers to one SQLite database
// file (appends, and subscribers' batches) take turns within a process,
// in arrival order, instead of racing each other through SQLite's busy
// handler.
//
// SQLite serializes writers with one lock per database, and a writer
// that finds it taken polls for it (the busy handler), sleeping up to
// 100 ms between tries until the busy timeout. The polling is unfair: a
// writer that has waited long sleeps long, and writers arriving later,
// whose first sleeps are 1 ms, take the lock before it. Under a steady
// stream of appends one append can then wait out the whole timeout while
// the others proceed, and fail with "database is locked" although the
// lock was never held for long; a batch, whose transaction starts the
// same way, could lose to a stream of appends likewise. The writers of
// one process queue here first, so only the head of the queue meets the
// busy handler, where it waits for writers this queue does not know of
// (another process, a Reset, the application's own).
//
// A queue that does not move for a waiter's patience (the busy timeout)
// fails the waiter as SQLite would have: its turn is not coming soon,
// because the writer ahead of it is itself waiting out the timeout or
// holds the lock that long (a batch whose handlers are slow).
package sqlitequeue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Queue orders the writers to one database file within the process. Its
// methods are safe for concurrent use.
type Queue struct {
	turn  chan struct{} // holds a token while an append has its turn
	moves atomic.Uint64 // turns ended so far
}

var (
	mu     sync.Mutex
	queues = map[string]*Queue{}
)

// For returns the process's queue for the database file (SQLite's full
// path of the main database, as pragma_database_list gives it), the same
// Queue for every store on that file. A private in-memory database
// (file "") gets a queue of its own.
func For(file string) *Queue {
	if file == "" {
		return newQueue()
	}
	mu.Lock()
	defer mu.Unlock()
	q, ok := queues[file]
	if !ok {
		q = newQueue()
		queues[file] = q
	}
	return q
}

func newQueue() *Queue { return &Queue{turn: make(chan struct{}, 1)} }

// Wait blocks until the caller's turn, ctx's end, or until the queue has
// not moved for patience (when positive), and returns the function that ends the turn,
// which the caller must call once, after its transaction has ended. The
// error of a queue that did not move names the wait and contains
// SQLite's "database is locked", so that callers treat it as SQLite's
// own.
func (q *Queue) Wait(ctx context.Context, patience time.Duration) (done func(), err error) {
	select {
	case q.turn <- struct{}{}:
		return q.done, nil
	default:
	}
	var stalled <-chan time.Time // nil without patience: wait for ctx alone
	var timer *time.Timer
	if patience > 0 {
		timer = time.NewTimer(patience)
		defer timer.Stop()
		stalled = timer.C
	}
	seen, since := q.moves.Load(), time.Now()
	for {
		select {
		case q.turn <- struct{}{}:
			return q.done, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the writers ahead in this process: %w", context.Cause(ctx))
		case <-stalled:
			if now := q.moves.Load(); now != seen {
				seen, since = now, time.Now()
				timer.Reset(patience)
				continue
			}
			return nil, fmt.Errorf("database is locked: the writer ahead in this process (an append or a batch) has held its turn for %s, the busy timeout, without finishing", time.Since(since).Round(time.Millisecond))
		}
	}
}

func (q *Queue) done() {
	q.moves.Add(1)
	<-q.turn
}
