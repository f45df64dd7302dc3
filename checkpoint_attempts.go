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

// AttemptRecord is the attempt in progress at one checkpoint row (a
// subscriber, or a partition of one), as an AttemptCounter keeps it. A
// record whose Position is no longer the checkpoint's is void: the commit
// that moves the checkpoint voids it.
type AttemptRecord struct {
	// Position is the checkpoint the attempt started from.
	Position int64
	// EventID is the first event attempted, Through the position of the
	// last one.
	EventID string
	Through int64
	// Attempts is how many attempts at these events have started; 0 is a
	// failure marker: the event EventID (at Through) failed after the
	// events before it in its batch had been handled.
	Attempts int
	// LastError is the last failure recorded.
	LastError string
	// Holder names the runner that wrote the record for an attempt it is
	// making or for the commit it is about to make (random per Run; see
	// AttemptCounter), or "" for a record of a failure, which claims
	// nothing.
	Holder string
}

// sameAttempt reports whether a, a stored record, is of an earlier
// attempt at rec: the same position and first event, or a failure marker
// at the same position (attempts 0: the event a.eventID at a.through
// failed after the events before it had been handled, see countAttempt).
func (a AttemptRecord) sameAttempt(rec AttemptRecord) bool {
	return a.Position == rec.Position && (a.EventID == rec.EventID || a.Attempts == 0)
}

// single reports whether the record is for one event at position at: a
// retry, or an attempt narrowed to the event after a failure.
func (a AttemptRecord) single(at int64) bool { return a.Through == at }

// AttemptCounter is the optional capability of a CheckpointStore that
// keeps attempt counts where every replica of a subscriber sees them, one
// record per checkpoint row, so that "1 + WithMaxRetries attempts, then
// parked" holds across replicas and restarts and an event whose handler
// crashes the process is parked too (docs/design.md, "Attempt counts").
// The run loop counts each attempt before its handlers run and records
// each failure before the batch is released. Without it each Subscriber
// counts in its own memory: replicas and restarts each count from zero,
// and a crashing event is attempted forever. GormCheckpointStore and
// MemoryCheckpointStore have it; subscriptionstest.RunAttemptCounterSuite
// checks a store of your own.
//
// Every method is called by the holder of the subscriber's batch (or, for
// FailAttempt, by the runner that just ended one), so that no two callers
// race on one record, and on the batch's own connection: nothing may wait
// for a second connection while it holds one (doc.go, "Connections").
//
// A store whose record is committed by ending the batch's transaction and
// taking the checkpoint again (GormCheckpointStore on Postgres) leaves a
// moment in which another replica can take the checkpoint and find the
// record of an attempt that is about to run, or of the commit the batch
// is about to make (a record past the batch's position). A record with a
// Holder is such a claim: while it is live (the store decides: its writer
// is still there and the claim is young) and at or past the asking
// batch's position, BeginAttempt and PutAttempt of another holder refuse
// with ErrAttemptClaimed, and the batch is given up as if the checkpoint
// were held; FailAttempt of another holder leaves it alone. The batch's
// Commit releases its claim, and so does its Rollback.
// A store that commits the record without releasing the checkpoint (as the
// memory store does) never returns ErrAttemptClaimed.
type AttemptCounter interface {
	// BeginAttempt records, committed before it returns, that batch is
	// about to run the events rec.EventID (after rec.Position) through
	// rec.Through, as attempt 1. If a record of an earlier attempt at them
	// exists (the same Position and EventID, or a failure marker at the
	// same Position: one that did not complete), it writes nothing and
	// returns that record with found true. An error wrapping
	// ErrCheckpointMoved (the checkpoint moved meanwhile) or
	// ErrAttemptClaimed gives the batch up.
	BeginAttempt(ctx context.Context, batch Batch, subscriber string, rec AttemptRecord) (prev AttemptRecord, found bool, err error)
	// PutAttempt writes rec, committed before it returns (its errors as
	// BeginAttempt's).
	PutAttempt(ctx context.Context, batch Batch, subscriber string, rec AttemptRecord) error
	// FailAttempt records rec.LastError for the single event rec
	// describes, unclaimed: on the record of the same attempt, keeping its
	// count, or as a new record of rec.Attempts. A non-nil batch is the failed
	// attempt's: FailAttempt rolls it back, and no batch of the subscriber
	// starts before the failure is recorded (so the next attempt, by any
	// replica, sees it). batch is ended even when the error is not nil.
	FailAttempt(ctx context.Context, batch Batch, subscriber string, rec AttemptRecord) error
	// HasAttempt reports whether a record of an attempt from position is
	// there, read in batch's transaction (nothing committed).
	HasAttempt(ctx context.Context, batch Batch, subscriber string, position int64) (bool, error)
	// ClearAttempt removes the subscriber's record as part of batch: it is
	// gone once the batch commits, and kept if it rolls back.
	ClearAttempt(ctx context.Context, batch Batch, subscriber string) error
}

var _ AttemptCounter = (*localAttempts)(nil)

// errAttemptMoved is BeginAttempt's or PutAttempt's error when the
// checkpoint moved (a Reset) while the record was written: the batch is
// to be given up as on ErrCheckpointMoved.
var errAttemptMoved = fmt.Errorf("recording the attempt: %w", ErrCheckpointMoved)

// ErrAttemptClaimed is an AttemptCounter's answer that another runner's
// live claim is on the record: that runner is about to take the
// checkpoint back for its attempt, and the batch is given up as if another
// replica held the checkpoint.
var ErrAttemptClaimed = errors.New("another replica is making an attempt from this checkpoint")

// attemptTable keeps records in memory: the memory checkpoint store's
// (shared by the subscribers that share the store) and the in-process
// count for stores without AttemptCounter.
type attemptTable struct {
	mu      sync.Mutex
	records map[string]AttemptRecord
}

func (t *attemptTable) begin(subscriber string, rec AttemptRecord) (AttemptRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.records[subscriber]; ok && prev.sameAttempt(rec) {
		return prev, true
	}
	t.put(subscriber, rec)
	return AttemptRecord{}, false
}

// put stores rec; t.mu is held.
func (t *attemptTable) put(subscriber string, rec AttemptRecord) {
	if t.records == nil {
		t.records = make(map[string]AttemptRecord)
	}
	t.records[subscriber] = rec
}

func (t *attemptTable) set(subscriber string, rec AttemptRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.put(subscriber, rec)
}

func (t *attemptTable) fail(subscriber string, rec AttemptRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.records[subscriber]; ok && prev.Position == rec.Position && prev.EventID == rec.EventID && prev.Through == rec.Through {
		prev.LastError = rec.LastError
		t.records[subscriber] = prev
		return
	}
	t.put(subscriber, rec)
}

func (t *attemptTable) has(subscriber string, position int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.records[subscriber]
	return ok && rec.Position == position
}

func (t *attemptTable) clear(subscriber string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.records, subscriber)
}

// localAttempts is the in-process count for a CheckpointStore without
// AttemptCounter: one per Subscriber (and shared by its partitions), lost
// with the process. clearAttempt clears at once; the records are voided
// by position anyway when the batch commits.
type localAttempts struct{ t attemptTable }

func (l *localAttempts) BeginAttempt(_ context.Context, _ Batch, subscriber string, rec AttemptRecord) (AttemptRecord, bool, error) {
	prev, found := l.t.begin(subscriber, rec)
	return prev, found, nil
}

func (l *localAttempts) PutAttempt(_ context.Context, _ Batch, subscriber string, rec AttemptRecord) error {
	l.t.set(subscriber, rec)
	return nil
}

func (l *localAttempts) FailAttempt(_ context.Context, batch Batch, subscriber string, rec AttemptRecord) error {
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

func (l *localAttempts) HasAttempt(_ context.Context, _ Batch, subscriber string, position int64) (bool, error) {
	return l.t.has(subscriber, position), nil
}

func (l *localAttempts) ClearAttempt(_ context.Context, _ Batch, subscriber string) error {
	l.t.clear(subscriber)
	return nil
}
