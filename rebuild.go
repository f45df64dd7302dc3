package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ResetCheckpointWith runs apply and sets the subscriber's checkpoint to
// position in one transaction, holding off every replica's batches from
// before apply runs until the commit: the way to rebuild a projection in
// place while subscribers of the name keep running, in this process or
// others. apply empties (or otherwise prepares) the projection through the
// transaction in its context:
//
//	err := sub.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
//		return subscriptions.TxFromContext(ctx).Exec("DELETE FROM balances").Error
//	})
//
// Either both happen or neither does. Readers of the projection see it
// empty, then filling up, while the replay runs; to keep serving the old
// projection meanwhile, build the new one under a new name instead (a
// blue/green rebuild, see WaitCaughtUp and DeleteState).
//
// apply must not end or keep the transaction, call ResetCheckpoint,
// ResetCheckpointWith or DeleteState for the same name, and
// ResetCheckpointWith must not be called from a handler of the same name:
// see CheckpointResetter. Parked events of the name are left as they are
// (docs/rebuilds.md says what to do with them).
//
// It needs a checkpoint store implementing CheckpointResetter (both stores
// in this package do); otherwise the error wraps errors.ErrUnsupported.
// A negative position is an error.
func (s *Subscriber) ResetCheckpointWith(ctx context.Context, position int64, apply func(ctx context.Context) error) error {
	if err := validatePosition(s.name, position); err != nil {
		return err
	}
	if err := s.checkPartitionCount(ctx); err != nil {
		return err // before apply runs
	}
	resetWith := func(ctx context.Context, name string, position int64, apply func(ctx context.Context) error) error {
		r, ok := s.checkpoints.(CheckpointResetter)
		if !ok {
			return fmt.Errorf("subscriptions: reset %q to %d with the application's statements: checkpoint store %T does not implement CheckpointResetter: %w", s.name, position, s.checkpoints, errors.ErrUnsupported)
		}
		return r.ResetWith(ctx, name, position, apply)
	}
	if s.partitions > 0 {
		resetWith = func(ctx context.Context, _ string, position int64, apply func(ctx context.Context) error) error {
			return s.resetPartitionsWith(ctx, position, apply)
		}
	}
	if err := resetWith(ctx, s.name, position, apply); err != nil {
		return err // the store names the subscriber and the position
	}
	s.logger.Info("subscriber checkpoint reset with the application's statements", "subscriber", s.name, "position", position)
	return nil
}

// caughtUpPoll bounds how often WaitCaughtUp reads the checkpoint.
const caughtUpPoll = 20 * time.Millisecond

// WaitCaughtUp reads the feed head and waits until the subscriber's
// committed checkpoint has reached it, then returns that head. Events
// appended after the call started are not waited for, so it returns even
// while appends continue. It serves blue/green rebuilds: run the new
// version under its own name ("balances/v2") into its own table, wait for
// it to catch up, switch readers in one transaction of the application's
// own (swap a view, rename tables, flip a read pointer), then retire the
// old name with DeleteState. Events appended during the switch are
// processed by the new version's subscriber, which keeps running.
//
// Any replica of the name may do the work; the call only reads the
// checkpoint (every caughtUpPoll, or the poll interval if shorter). A
// parked event counts as processed; without a parking lot an event whose
// handler keeps failing halts the checkpoint, and WaitCaughtUp then waits
// until ctx ends. It returns ctx's error wrapped when ctx ends first.
func (s *Subscriber) WaitCaughtUp(ctx context.Context) (int64, error) {
	if s.partitions > 0 {
		return s.waitPartitionsCaughtUp(ctx)
	}
	if err := s.checkPartitionCount(ctx); err != nil {
		return 0, err
	}
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		return 0, fmt.Errorf("subscriptions: wait for %q to catch up: %w", s.name, err)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("subscriptions: wait for %q to catch up to position %d: %w", s.name, head, ctx.Err())
		case <-timer.C:
		}
		position, err := s.checkpoints.Position(ctx, s.name)
		if err != nil && ctx.Err() == nil {
			return 0, err // the store names the subscriber
		}
		if err == nil && position >= head {
			return head, nil
		}
		timer.Reset(min(caughtUpPoll, s.pollInterval))
	}
}

// DeleteState retires the subscriber's name: it deletes its checkpoint and
// every event parked for it (with WithParkingLot). Both go in one
// transaction only when the parking lot is built on the same *gorm.DB as
// the checkpoint store (on SQLite, at least on the same database file);
// otherwise the parked events are purged first, and a checkpoint delete
// that then fails leaves them purged. While it runs, a Run of this
// Subscriber is refused with ErrRunning. A subscriber of the name that runs again
// afterwards starts from position 0, so stop every replica of the name
// first (in every process); this Subscriber refuses with an error wrapping
// ErrRunning while its own Run is running.
//
// Batches of the name are held off while the state is deleted, as for
// ResetCheckpointWith. It needs a checkpoint store implementing
// CheckpointResetter and, with a parking lot, a lot implementing
// ParkingLotPurger (every store in this package does); otherwise the error
// wraps errors.ErrUnsupported.
func (s *Subscriber) DeleteState(ctx context.Context) error {
	// Hold running for the whole call: a Run starting in between the check
	// and the delete would re-create the checkpoint at 0.
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("subscriptions: delete the state of %q: %w", s.name, ErrRunning)
	}
	defer s.running.Store(false)
	if err := s.checkPartitionCount(ctx); err != nil {
		return err
	}
	r, ok := s.checkpoints.(CheckpointResetter)
	if !ok {
		return fmt.Errorf("subscriptions: delete the state of %q: checkpoint store %T does not implement CheckpointResetter: %w", s.name, s.checkpoints, errors.ErrUnsupported)
	}
	var purge func(ctx context.Context) error
	if s.parking != nil {
		p, ok := s.parking.(ParkingLotPurger)
		if !ok {
			return fmt.Errorf("subscriptions: delete the state of %q: parking lot %T does not implement ParkingLotPurger: %w", s.name, s.parking, errors.ErrUnsupported)
		}
		purge = func(ctx context.Context) error {
			var err error
			if own, ok := p.(rawPurger); ok {
				err = own.purge(ctx, s.name) // the store's error already names the subscriber
			} else {
				err = p.Purge(ctx, s.name)
			}
			if err != nil {
				return &stepError{step: "purge parked events", err: err}
			}
			return nil
		}
	}
	del := r.Delete
	if s.partitions > 0 {
		del = func(ctx context.Context, _ string, purge func(ctx context.Context) error) error {
			return s.deletePartitions(ctx, purge)
		}
	}
	if err := del(ctx, s.name, purge); err != nil {
		return err // the store names the subscriber
	}
	s.logger.Info("subscriber state deleted", "subscriber", s.name)
	return nil
}

// rawPurger is a ParkingLotPurger of this package: purge is Purge without
// the context Purge adds to its errors, which DeleteState's store error
// already carries.
type rawPurger interface {
	purge(ctx context.Context, subscriber string) error
}

var _ rawPurger = (*GormParkingLot)(nil)
