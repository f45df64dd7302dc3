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
// Either both happen or neither does, and the mark that makes the replayed
// events re-deliveries (DeliveryFrom) is written in the same transaction.
// Readers of the projection see it empty, then filling up, while the
// replay runs; to keep serving the old
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
	resetWith := func(ctx context.Context, name string, position int64, apply func(ctx context.Context) error) error {
		r, ok := s.checkpoints.(CheckpointResetter)
		if !ok {
			return fmt.Errorf("subscriptions: reset %q to %d with the application's statements: checkpoint store %T does not implement CheckpointResetter: %w", s.name, position, s.checkpoints, errors.ErrUnsupported)
		}
		// The partition count is checked in the reset's transaction,
		// before apply runs (countGuard).
		return r.ResetWith(ctx, name, position, guarded(s.countGuard, apply))
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
	s.notifyReset()
	return nil
}

// SwitchOver makes s, the new version of a projection built under its own
// name, the one readers see in place of old, the version they read now,
// so that no reader ever sees the projection go back: it pauses old
// everywhere (Pause: its table stops changing, in every process), waits
// until s has handled every event old had handled, and then calls
// switchReaders, the application's switch (swap a view, rename tables,
// flip a read pointer) in one transaction of its own. Before the switch
// readers see old's table, which only grows until the pause; after it
// s's, which holds at least every event old held and only grows. old
// stays paused (retired): stop its subscribers when convenient, then
// old.DeleteState and drop its table. docs/rebuilds.md gives the whole
// procedure.
//
// s keeps running meanwhile (in this process or another), as old's
// replicas may; appends continue. The pause lasts as long as s needs to
// reach old's checkpoint, which is short once s has caught up
// (WaitCaughtUp) before the call. If ctx ends or switchReaders fails, old
// is resumed before SwitchOver returns the error, and keeps serving.
//
// It needs checkpoint stores that can pause (this package's; otherwise the
// error wraps ErrPauseUnsupported); old and s must have different names.
func (s *Subscriber) SwitchOver(ctx context.Context, old *Subscriber, switchReaders func(ctx context.Context) error) (err error) {
	what := fmt.Sprintf("subscriptions: switch readers from %q to %q", old.name, s.name)
	if old.name == s.name {
		return fmt.Errorf("%s: the versions need names of their own", what)
	}
	if switchReaders == nil {
		return fmt.Errorf("%s: nil switch", what)
	}
	positions, err := old.pause(ctx, "switching readers to "+s.name)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := old.Resume(rctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("%q stays paused: %w", old.name, rerr))
		}
	}()
	var target int64
	for _, p := range positions {
		target = max(target, p)
	}
	if err := s.checkPartitionCount(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := s.waitCaughtUpTo(ctx, target); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := switchReaders(ctx); err != nil {
		return fmt.Errorf("%s: the application's switch: %w", what, err)
	}
	s.logger.Info("readers switched", "from", old.name, "to", s.name, "position", target)
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
	if err := s.checkPartitionCount(ctx); err != nil {
		return 0, err
	}
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		return 0, fmt.Errorf("subscriptions: wait for %q to catch up: %w", s.name, err)
	}
	return head, s.waitCaughtUpTo(ctx, head)
}

// waitCaughtUpTo waits until the subscriber has handled every event at or
// below target (see WaitCaughtUp).
func (s *Subscriber) waitCaughtUpTo(ctx context.Context, head int64) error {
	if s.partitions > 0 {
		return s.waitPartitionsCaughtUp(ctx, head)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("subscriptions: wait for %q to catch up to position %d: %w", s.name, head, ctx.Err())
		case <-timer.C:
		}
		position, err := s.checkpoints.Position(ctx, s.name)
		if err != nil && ctx.Err() == nil {
			return err // the store names the subscriber
		}
		if err == nil && position == RetiredCheckpoint {
			return s.retiredError(ctx, s.name) // repartitioned meanwhile
		}
		if err == nil && position >= head {
			return nil
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
	// The partition count is checked in the delete's transaction, before
	// the purge (countGuard).
	del := func(ctx context.Context, name string, purge func(ctx context.Context) error) error {
		return r.Delete(ctx, name, guarded(s.countGuard, purge))
	}
	if s.partitions > 0 {
		del = func(ctx context.Context, _ string, purge func(ctx context.Context) error) error {
			return s.deletePartitions(ctx, purge)
		}
	} else if ps, ok := s.checkpoints.(PartitionCheckpointStore); ok {
		// A name repartitioned to run unpartitioned records that in its
		// partition count's row, which goes too.
		marker := partitionMarker(s.name)
		recorded, err := ps.Positions(ctx, []string{marker})
		if err != nil {
			return err // the store names the checkpoint
		}
		if recorded[0] < 0 {
			del = func(ctx context.Context, name string, purge func(ctx context.Context) error) error {
				return ps.DeleteAll(ctx, []string{name, marker}, s.countGuard, purge)
			}
		}
	}
	if err := del(ctx, s.name, purge); err != nil {
		return err // the store names the subscriber
	}
	s.logger.Info("subscriber state deleted", "subscriber", s.name)
	return nil
}

// rawPurger is implemented by this package's GORM parking lot: purge is
// Purge without the context Purge adds to its errors, which DeleteState's
// store error already carries (a lot of another kind names the subscriber
// twice, nothing worse).
type rawPurger interface {
	purge(ctx context.Context, subscriber string) error
}
