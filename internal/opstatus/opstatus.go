// Package opstatus computes what the operations surfaces (the admin HTTP
// handler and cmd/subscriptions) show for one subscriber: position, feed
// head, lag in events and in time, parked count. It is the one home of
// that computation until Subscriber.Status exists; switching to it then
// changes the callers of Read only.
//
// Read is safe for concurrent use; it only reads through the functions it
// is given.
package opstatus

import (
	"context"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// States of a subscriber, as shown to operators.
const (
	StateCaughtUp = "caught up"
	StateBehind   = "behind"
	StateAhead    = "checkpoint ahead of head"
	StateError    = "error"
)

// Status is one subscriber's row in a status table.
type Status struct {
	Subscriber string `json:"subscriber"`
	Position   int64  `json:"position"`
	Head       int64  `json:"head"`
	// Lag is Head minus Position (0 when caught up or ahead).
	Lag int64 `json:"lag"`
	// LagSeconds is how long ago the oldest unprocessed event was
	// appended (0 when caught up).
	LagSeconds float64 `json:"lag_seconds"`
	// Parked is the number of parked events; -1 without a parking lot.
	Parked int    `json:"parked"`
	State  string `json:"state"`
	// Error is the first read that failed, if any (State is then
	// StateError and the fields after it are zero).
	Error string `json:"error,omitempty"`
}

// Sources are the reads Read needs for one subscriber.
type Sources struct {
	Events domain.EventStore
	// Position reads the committed checkpoint.
	Position func(ctx context.Context) (int64, error)
	// Parked counts the parked events; nil means no parking lot.
	Parked func(ctx context.Context) (int, error)
}

// Read computes the status of subscriber name at time now. Read errors
// are reported in the Status, not returned: a status table shows every
// subscriber, including the ones it cannot read.
func Read(ctx context.Context, name string, src Sources, now time.Time) Status {
	st := Status{Subscriber: name, Parked: -1}
	fail := func(err error) Status {
		st.State, st.Error = StateError, err.Error()
		return st
	}
	var err error
	if st.Position, err = src.Position(ctx); err != nil {
		return fail(err)
	}
	if st.Head, err = src.Events.HeadPosition(ctx); err != nil {
		return fail(err)
	}
	if src.Parked != nil {
		if st.Parked, err = src.Parked(ctx); err != nil {
			return fail(err)
		}
	}
	switch {
	case st.Position > st.Head:
		st.State = StateAhead
	case st.Position == st.Head:
		st.State = StateCaughtUp
	default:
		st.State = StateBehind
		st.Lag = st.Head - st.Position
		next, err := src.Events.ReadAfter(ctx, st.Position, 1)
		if err != nil {
			return fail(err)
		}
		if len(next) == 1 && !next[0].Created.IsZero() {
			st.LagSeconds = max(0, now.Sub(next[0].Created).Seconds())
		}
	}
	return st
}
