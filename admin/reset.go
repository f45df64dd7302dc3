package admin

import (
	"context"
	"fmt"

	"github.com/eventfeed/subscriptions"
)

// BeyondHeadError is CheckReset's refusal of a position past the feed
// head.
type BeyondHeadError struct {
	Subscriber     string
	Position, Head int64
}

func (e *BeyondHeadError) Error() string {
	return fmt.Sprintf("position %d is beyond the feed head %d: subscriber %q would skip the events appended until the feed reaches it; nothing was changed",
		e.Position, e.Head, e.Subscriber)
}

// CheckReset is the rule both admin surfaces (the handler's reset and
// cmd/subscriptions' reset) apply before Subscriber.ResetCheckpoint: a
// checkpoint past the feed head would skip every event appended until the
// feed gets there (and Status would report ErrCheckpointAhead), so such a
// position is refused with a *BeyondHeadError. It returns nil for a
// position from 0 to the head, and the error of reading the head
// otherwise. It reads the head once (Subscriber.Head) and changes
// nothing; safe for concurrent use. The head only grows, so a position it
// allows stays allowed until the reset.
func CheckReset(ctx context.Context, s *subscriptions.Subscriber, position int64) error {
	if position < 0 {
		return fmt.Errorf("admin: reset of %q: position %d is negative", s.Name(), position)
	}
	head, err := s.Head(ctx)
	if err != nil {
		return fmt.Errorf("admin: reset of %q: %w", s.Name(), err)
	}
	if position > head {
		return &BeyondHeadError{Subscriber: s.Name(), Position: position, Head: head}
	}
	return nil
}
