package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// This file holds the durable attempt count behind "WithMaxRetries
// retries, then parked" (docs/design.md, "Attempt counts"): every
// attempt is counted before it runs, in a write committed on its own, so
// that replicas sharing a checkpoint and restarts of a crashed process
// continue one count instead of each starting at zero.

// attemptRecord is the attempt in progress at one checkpoint row (a
// subscriber, or a partition of one): the checkpoint it started from, the
// first and last events it covers, how many times an attempt at them has
// started, and the last failure recorded. A record whose position is no
// longer the checkpoint's is void: the commit that moves the checkpoint
// clears it.
type attemptRecord struct {
	position  int64  // the checkpoint the attempt started from
	eventID   string // the first event attempted
	through   int64  // the position of the last event attempted
	attempts  int
	lastError string
	// holder names the runner making the attempt (runner.holder), ""
	// for a record of a failure or of an attempt to come, which claims
	// nothing (see attemptCounter).
	holder string
}

// sameAttempt reports whether a, a stored record, is of an earlier
// attempt at rec: the same position and first event, or a failure marker
// at the same position (attempts 0: the event a.eventID at a.through
// failed after the events before it had been handled, see countAttempt).
func (a attemptRecord) sameAttempt(rec attemptRecord) bool {
	return a.position == rec.position && (a.eventID == rec.eventID || a.attempts == 0)
}

// single reports whether the record is for one event at position at: a
// retry, or an attempt narrowed to the event after a failure.
func (a attemptRecord) single(at int64) bool { return a.through == at }

// attemptCounter is the optional capability of a CheckpointStore that
// keeps attempt counts where every replica of the subscriber sees them.
// GormCheckpointStore and MemoryCheckpointStore implement it; for any
// other store each Subscriber counts in its own memory (localAttempts),
// as before: then replicas and restarts each count from zero.
//
// Every method is called by the holder of the subscriber's batch (or, for
// failAttempt, by the runner that just ended one), so that no two callers
// race on one record, and on the batch's own connection: nothing waits
// for a second connection while it holds one (doc.go, "Connections").
//
// A store whose record is committed by ending the batch's transaction and
// taking the checkpoint again (GormCheckpointStore) leaves a moment in
// which another replica can take the checkpoint and find the record of an
// attempt that is about to run. A record with a holder is such a claim:
// while it is live (the store decides: its writer is still there and the
// claim is young), beginAttempt and putAttempt of another holder refuse
// with errAttemptClaimed, and the batch is given up as if the checkpoint
// were held; failAttempt of another holder leaves it alone.
type attemptCounter interface {
	// beginAttempt records, committed before it returns, that batch is
	// about to run the events rec.eventID (after rec.position) through
	// rec.through, as attempt 1. If a record of an earlier attempt at it
	// exists (sameAttempt: one that did not complete), it writes nothing
	// and returns that record with found true.
	beginAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) (prev attemptRecord, found bool, err error)
	// putAttempt writes rec, committed before it returns.
	putAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error
	// failAttempt records rec.lastError for the single event rec
	// describes: on the record of the same event, keeping its count, or as
	// a new record of rec.attempts. A non-nil batch is the failed
	// attempt's: failAttempt rolls it back, and no batch of the subscriber
	// starts before the failure is recorded (so the next attempt, by any
	// replica, sees it). batch is ended even when the error is not nil.
	failAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error
	// hasAttempt reports whether a record of an attempt from position is
	// there, read in batch's transaction (nothing committed).
	hasAttempt(ctx context.Context, batch Batch, subscriber string, position int64) (bool, error)
	// clearAttempt removes the subscriber's record as part of batch: it is
	// gone once the batch commits, and kept if it rolls back.
	clearAttempt(ctx context.Context, batch Batch, subscriber string) error
}

var _ attemptCounter = (*localAttempts)(nil)

// errAttemptMoved is beginAttempt's or putAttempt's error when the
// checkpoint moved (a Reset) while the record was written: the batch is
// to be given up as on ErrCheckpointMoved.
var errAttemptMoved = fmt.Errorf("recording the attempt: %w", ErrCheckpointMoved)

// errAttemptClaimed is beginAttempt's or putAttempt's error when another
// runner's live claim is on the record (see attemptCounter): that runner
// is about to take the checkpoint back, and the batch is to be given up
// as if another replica held the checkpoint.
var errAttemptClaimed = errors.New("another replica is making an attempt from this checkpoint")

// attemptTable keeps records in memory: the memory checkpoint store's
// (shared by the subscribers that share the store) and the in-process
// fallback for other stores.
type attemptTable struct {
	mu      sync.Mutex
	records map[string]attemptRecord
}

func (t *attemptTable) begin(subscriber string, rec attemptRecord) (attemptRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.records[subscriber]; ok && prev.sameAttempt(rec) {
		return prev, true
	}
	t.put(subscriber, rec)
	return attemptRecord{}, false
}

// put stores rec; t.mu is held.
func (t *attemptTable) put(subscriber string, rec attemptRecord) {
	if t.records == nil {
		t.records = make(map[string]attemptRecord)
	}
	t.records[subscriber] = rec
}

func (t *attemptTable) set(subscriber string, rec attemptRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.put(subscriber, rec)
}

func (t *attemptTable) fail(subscriber string, rec attemptRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.records[subscriber]; ok && prev.position == rec.position && prev.eventID == rec.eventID && prev.through == rec.through {
		prev.lastError = rec.lastError
		t.records[subscriber] = prev
		return
	}
	t.put(subscriber, rec)
}

func (t *attemptTable) has(subscriber string, position int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.records[subscriber]
	return ok && rec.position == position
}

func (t *attemptTable) clear(subscriber string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.records, subscriber)
}

// localAttempts is the in-process count for a CheckpointStore without
// attemptCounter: one per Subscriber (and shared by its partitions), lost
// with the process. clearAttempt clears at once; the records are voided
// by position anyway when the batch commits.
type localAttempts struct{ t attemptTable }

func (l *localAttempts) beginAttempt(_ context.Context, _ Batch, subscriber string, rec attemptRecord) (attemptRecord, bool, error) {
	prev, found := l.t.begin(subscriber, rec)
	return prev, found, nil
}

func (l *localAttempts) putAttempt(_ context.Context, _ Batch, subscriber string, rec attemptRecord) error {
	l.t.set(subscriber, rec)
	return nil
}

func (l *localAttempts) failAttempt(_ context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	l.t.fail(subscriber, rec)
	return rollbackIf(batch)
}

// rollbackIf rolls batch back unless it is nil.
func rollbackIf(batch Batch) error {
	if batch == nil {
		return nil
	}
	return batch.Rollback()
}

func (l *localAttempts) hasAttempt(_ context.Context, _ Batch, subscriber string, position int64) (bool, error) {
	return l.t.has(subscriber, position), nil
}

func (l *localAttempts) clearAttempt(_ context.Context, _ Batch, subscriber string) error {
	l.t.clear(subscriber)
	return nil
}
