package subscriptions

import (
	"context"
	"errors"

	"github.com/eventfeed/subscriptions/domain"
)

// acquirer is the run loop's one way into its stores: read the feed after
// a position and acquire the subscriber's checkpoint, as one call (the
// order of the two steps is the implementation's; see doc.go for the
// model). It is decided once, in NewSubscriber (newAcquirer), so the loop
// knows no database.
//
// The answers of acquireAfter:
//   - an error wrapped in *feedReadError: the feed could not be read (or
//     ctx was cancelled before the checkpoint was acquired); nothing is held;
//   - any other error: the checkpoint could not be acquired;
//   - no events: nothing past after; batch, if not nil, holds nothing the
//     caller needs and is to be rolled back;
//   - events and a nil batch, or errCheckpointHeld: another replica holds
//     the checkpoint;
//   - events and a batch: the batch holds the checkpoint; the caller owns
//     it, checks its position against after, and ends it.
//
// The batch is acquired on a context without ctx's cancellation, so that
// shutdown drains it instead of abandoning it. expectWork is false on a
// timed poll, which usually finds nothing: an implementation that would
// open a transaction to read then reads first without one.
//
// Implementations are safe for concurrent use, as the stores are.
type acquirer interface {
	acquireAfter(ctx context.Context, subscriber string, after int64, limit int, expectWork bool) (Batch, []domain.EventEnvelope[any], error)
}

// acquirerSource is implemented by checkpoint stores that can do better
// than readThenAcquire for some event stores (GormCheckpointStore on
// Postgres: one round trip, see acquire_pipeline_postgres.go). acquirerFor
// returns nil when it cannot for events; fallback is the ordinary
// acquirer, for the cases the faster one leaves to it.
type acquirerSource interface {
	acquirerFor(events domain.EventStore, fallback acquirer) acquirer
}

// newAcquirer returns the acquirer for events and checkpoints: the
// checkpoint store's own when it offers one for this event store (looked
// up under this package's decorators, whose reads are the store's), else
// readThenAcquire.
func newAcquirer(events domain.EventStore, checkpoints CheckpointStore) acquirer {
	ordinary := readThenAcquire{events: events, checkpoints: checkpoints}
	if src, ok := checkpoints.(acquirerSource); ok {
		if a := src.acquirerFor(undecorated(events), ordinary); a != nil {
			return a
		}
	}
	return ordinary
}

// readThenAcquire is the ordinary acquirer: EventStore.ReadAfter, then
// CheckpointStore.Acquire. No batch transaction is open while the feed is
// read, so an idle poll costs the read alone, and a database with a
// single connection (in-memory SQLite) never needs a second one mid-batch.
type readThenAcquire struct {
	events      domain.EventStore
	checkpoints CheckpointStore
}

func (a readThenAcquire) acquireAfter(ctx context.Context, subscriber string, after int64, limit int, _ bool) (Batch, []domain.EventEnvelope[any], error) {
	events, err := a.events.ReadAfter(ctx, after, limit)
	if err != nil {
		return nil, nil, &feedReadError{err: err}
	}
	if len(events) == 0 {
		return nil, nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, &feedReadError{err: err}
	}
	batch, acquired, err := a.checkpoints.Acquire(context.WithoutCancel(ctx), subscriber)
	if err != nil || !acquired {
		return nil, events, err
	}
	return batch, events, nil
}

// errCheckpointHeld is an acquirer's answer that another replica holds the
// checkpoint, for an acquirer that tries the lock before reading the
// events (indexedAcquirer): the run loop treats it as the events-and-no-
// batch answer.
var errCheckpointHeld = errors.New("the checkpoint is held by another replica")

// feedReadError is an acquirer's failure to read the feed, which the run
// loop treats as transient (or fatal: domain.ErrGlobalOrderingNotSupported)
// where a failed acquisition only fails the cycle.
type feedReadError struct{ err error }

func (e *feedReadError) Error() string { return e.err.Error() }
func (e *feedReadError) Unwrap() error { return e.err }
