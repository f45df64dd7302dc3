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

// FeedAcquirer is the optional capability of a CheckpointStore that
// acquires a subscriber's checkpoint and reads the feed past it in one
// step, on the batch's own connection, for an event store it shares
// (FeedSharer): GormCheckpointStore on Postgres sends BEGIN, the row lock
// and the feed read as one pipelined round trip, which is most of the
// latency between a wake-up and the handler. The run loop uses it on a
// wake-up and while catching up (a timed poll, which usually finds
// nothing, reads first without a transaction); without it, or when
// AcquireAfter declines, it reads the feed and then acquires.
type FeedAcquirer interface {
	FeedSharer
	// AcquireAfter acquires subscriber's checkpoint and reads up to limit
	// events of the shared feed after after, in the batch's transaction.
	// ok false: not done here (nothing is held; the caller takes the
	// ordinary path, which also tells a row another replica holds from a
	// missing one). Otherwise the caller owns batch (which may be at
	// another position than after: it checks, as on the ordinary path)
	// and ends it. The batch is acquired on a context without ctx's
	// cancellation, so that shutdown drains it.
	AcquireAfter(ctx context.Context, subscriber string, after int64, limit int) (batch Batch, events []domain.EventEnvelope[any], ok bool, err error)
}

// newAcquirer returns the acquirer for events and checkpoints: the
// checkpoint store's one-step acquire when it shares this event store
// (looked up under this package's decorators, whose reads are the
// store's), else readThenAcquire.
func newAcquirer(events domain.EventStore, checkpoints CheckpointStore) acquirer {
	ordinary := readThenAcquire{events: events, checkpoints: checkpoints}
	if fa, ok := checkpoints.(FeedAcquirer); ok && fa.SharesFeed(undecorated(events)) {
		return feedAcquirer{store: fa, fallback: ordinary}
	}
	return ordinary
}

// feedAcquirer is the acquirer of a FeedAcquirer: its AcquireAfter on a
// wake-up or while catching up, fallback otherwise and whenever it
// declines. Safe for concurrent use.
type feedAcquirer struct {
	store    FeedAcquirer
	fallback acquirer
}

func (a feedAcquirer) acquireAfter(ctx context.Context, subscriber string, after int64, limit int, expectWork bool) (Batch, []domain.EventEnvelope[any], error) {
	if !expectWork {
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	batch, events, ok, err := a.store.AcquireAfter(context.WithoutCancel(ctx), subscriber, after, limit)
	if err == nil && !ok {
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	return batch, events, err
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
