package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Pauser is the optional capability of a CheckpointStore that pauses a
// subscriber name durably, for Subscriber.Pause, Resume and SwitchOver
// (without it they fail with ErrPauseUnsupported). The run loop calls
// none of its methods: the store keeps a paused name's batches from
// running, by any replica of any process, until Resume. Its Acquire of a
// checkpoint row paused under its key (PauseKey) returns acquired false,
// as if another replica held it, and its Commit of a batch whose name was
// paused after the batch was acquired fails with ErrCheckpointMoved (the
// batch is discarded). This package's stores have it;
// subscriptionstest.RunPauserSuite checks a store of your own.
type Pauser interface {
	// Pause records key as paused and returns once no batch of names (the
	// checkpoint rows paused under key) is in flight, with their
	// checkpoints: positions no batch moves any more until Resume. A batch
	// in flight commits or rolls back; none commits after Pause returned.
	// A Pause that fails once the pause is recorded (its ctx ends while it
	// waits) says so: the name stays paused until Resume.
	Pause(ctx context.Context, key string, names []string, reason string) ([]int64, error)
	// Resume lifts key's pause; resuming a name that is not paused is not
	// an error.
	Resume(ctx context.Context, key string) error
	// PausedSince reports whether key is paused, since when and why (the
	// first Pause's reason).
	PausedSince(ctx context.Context, key string) (PauseRecord, bool, error)
}

// PauseRecord is a name's pause as Pauser.PausedSince reads it: when it
// was recorded and the reason given to Pause, for Status and the
// operator surfaces.
type PauseRecord struct {
	Since  time.Time // UTC
	Reason string    // "" when none was given
}

// ErrPauseUnsupported is returned by Pause, Resume and SwitchOver when the
// checkpoint store cannot pause a name (it lacks the capability this
// package's stores have).
var ErrPauseUnsupported = fmt.Errorf("the checkpoint store cannot pause a subscriber: %w", errors.ErrUnsupported)

// Pause stops the subscriber's name everywhere, durably: every replica, in
// every process, and every partition of it, handles nothing from its next
// batch on, until Resume; a restart does not lift it. The batch in flight
// when Pause is called commits or rolls back as usual; none commits after
// Pause returned. A paused subscriber's Run keeps running (idle, as when
// another replica holds the checkpoint) and picks up where it stopped once
// resumed. reason is recorded with the pause for operators. Pausing a
// paused name keeps the first pause. A Pause whose ctx ends while it
// waits for the batch in flight fails, but its error says when the pause
// was recorded all the same (Resume lifts it).
//
// It needs this package's checkpoint stores (otherwise the error wraps
// ErrPauseUnsupported). Safe for concurrent use, from any process.
func (s *Subscriber) Pause(ctx context.Context, reason string) error {
	_, err := s.pause(ctx, reason)
	return err
}

// pause is Pause returning the name's checkpoints as they stand once no
// batch of it is in flight.
func (s *Subscriber) pause(ctx context.Context, reason string) ([]int64, error) {
	p, ok := s.checkpoints.(Pauser)
	if !ok {
		return nil, fmt.Errorf("subscriptions: pause %q: checkpoint store %T: %w", s.name, s.checkpoints, ErrPauseUnsupported)
	}
	if err := s.checkPartitionCount(ctx); err != nil {
		return nil, err
	}
	names := []string{s.name}
	if s.partitions > 0 {
		names = s.partitionNames()
	}
	positions, err := p.Pause(ctx, s.name, names, reason)
	if err != nil {
		return nil, err // the store names the subscriber
	}
	s.logger.Info("subscriber paused", "subscriber", s.name, "reason", reason)
	return positions, nil
}

// Resume lifts Pause: the name's replicas go on from their checkpoints at
// their next poll (or wake-up). Resuming a name that is not paused is not
// an error.
func (s *Subscriber) Resume(ctx context.Context) error {
	p, ok := s.checkpoints.(Pauser)
	if !ok {
		return fmt.Errorf("subscriptions: resume %q: checkpoint store %T: %w", s.name, s.checkpoints, ErrPauseUnsupported)
	}
	if err := p.Resume(ctx, s.name); err != nil {
		return err // the store names the subscriber
	}
	s.logger.Info("subscriber resumed", "subscriber", s.name)
	s.notifyReset()
	return nil
}
