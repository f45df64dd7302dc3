package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// ParkedPage is one page of ListParkedPage.
type ParkedPage struct {
	// Events are the page's parked events in position order (never nil).
	Events []ParkedEvent `json:"events"`
	// More reports that events past this page match the filter: pass
	// NextAfter as the filter's AfterPosition to read them.
	More      bool  `json:"more"`
	NextAfter int64 `json:"next_after,omitempty"`
}

// ParkedReplayResult reports a ReplayParkedMatching run.
type ParkedReplayResult struct {
	// Replayed are the IDs of the events replayed and cleared, in position
	// order.
	Replayed []string `json:"replayed"`
	// Failed are the events whose replay failed; they stay parked.
	Failed []ParkedReplayFailure `json:"failed"`
	// Held are the IDs of matching events left parked behind an earlier
	// parked event of their aggregate that was not replayed
	// (ErrParkedBehindHead): not failures of their own.
	Held []string `json:"held"`
}

// ParkedReplayFailure is one failed replay of ReplayParkedMatching.
type ParkedReplayFailure struct {
	EventID  string `json:"event_id"`
	Position int64  `json:"position"`
	Error    string `json:"error"`
}

// managed returns the subscriber's lot as a ManagedParkingLot, or an
// error naming the operation.
func (s *Subscriber) managed(op string) (ManagedParkingLot, error) {
	if s.parking == nil {
		return nil, fmt.Errorf("subscriptions: %s of %q: %w", op, s.name, ErrNoParkingLot)
	}
	m, ok := s.parking.(ManagedParkingLot)
	if !ok {
		return nil, fmt.Errorf("subscriptions: %s of %q: %T: %w", op, s.name, s.parking, ErrParkingLotNotManaged)
	}
	return m, nil
}

// GetParked returns one of this subscriber's parked events, or an error
// wrapping ErrEventNotParked. Requires a ManagedParkingLot.
func (s *Subscriber) GetParked(ctx context.Context, eventID string) (ParkedEvent, error) {
	lot, err := s.managed("get parked event")
	if err != nil {
		return ParkedEvent{}, err
	}
	return lot.Get(ctx, s.name, eventID)
}

// ListParkedPage returns one page of this subscriber's parked events that
// match filter, in position order; filter.Limit is the page size (0: the
// whole list). Requires a ManagedParkingLot.
func (s *Subscriber) ListParkedPage(ctx context.Context, filter ParkedFilter) (ParkedPage, error) {
	lot, err := s.managed("list parked events")
	if err != nil {
		return ParkedPage{}, err
	}
	query := filter
	if filter.Limit > 0 && filter.Limit < math.MaxInt {
		query.Limit = filter.Limit + 1 // one more tells whether a next page exists
	}
	events, err := lot.ListFiltered(ctx, s.name, query)
	if err != nil {
		return ParkedPage{}, err
	}
	page := ParkedPage{Events: events}
	if filter.Limit > 0 && len(events) > filter.Limit {
		page.Events = events[:filter.Limit]
		page.More = true
		page.NextAfter = page.Events[len(page.Events)-1].Position
	}
	return page, nil
}

// DiscardParked removes one parked event without running the handler —
// for an event that will never succeed — and returns the removed entry;
// the head of a queue (see WithOrderedParking) leaves the next entry its
// queue's head.
// The discard is logged at warning level with the subscriber's logger:
// by (the operator, as the caller identifies them), the event and the
// error it was parked with, so that dropping an event always leaves a
// trace. Requires a ManagedParkingLot; an event that is not parked
// returns an error wrapping ErrEventNotParked.
func (s *Subscriber) DiscardParked(ctx context.Context, eventID, by string) (ParkedEvent, error) {
	lot, err := s.managed("discard parked event")
	if err != nil {
		return ParkedEvent{}, err
	}
	p, err := lot.Discard(ctx, s.name, eventID)
	if err != nil {
		return ParkedEvent{}, err
	}
	s.logger.Warn("parked event discarded", "subscriber", s.name, "by", by, "event_id", p.EventID,
		"event_type", p.EventType, "position", p.Position, "aggregate_id", p.AggregateID,
		"attempts", p.Attempts, "parked_error", p.Error, "held_by", p.HeldBy)
	return p, nil
}

// ReplayParkedMatching replays, one by one in position order, this
// subscriber's parked events that match filter (filter.Limit caps how
// many are tried). Each replay is a ReplayParked: its own transaction, a
// failure recorded on the entry, with WithOrderedParking the queue behind
// it (Replayed lists those too). With continueOnError false it stops at
// the first failure; with true it tries every matching event. An event
// behind an earlier parked event of its aggregate is not tried (Held).
// The error is nil only when every tried replay succeeded, and otherwise
// joins the failures (a cancelled ctx ends the run early with ctx's
// error). Requires a ManagedParkingLot.
func (s *Subscriber) ReplayParkedMatching(ctx context.Context, filter ParkedFilter, continueOnError bool) (ParkedReplayResult, error) {
	res := ParkedReplayResult{Replayed: []string{}, Failed: []ParkedReplayFailure{}, Held: []string{}}
	lot, err := s.managed("replay parked events")
	if err != nil {
		return res, err
	}
	const pageSize = 100
	remaining := filter.Limit
	cursor := filter
	var errs []error
	for {
		cursor.Limit = pageSize
		if filter.Limit > 0 {
			cursor.Limit = min(pageSize, remaining)
		}
		page, err := lot.ListFiltered(ctx, s.name, cursor)
		if err != nil {
			return res, errors.Join(append(errs, err)...)
		}
		for _, p := range page {
			if err := ctx.Err(); err != nil {
				return res, errors.Join(append(errs, err)...)
			}
			cursor.AfterPosition = p.Position
			replayed, failed, err := s.replayParked(ctx, p.EventID)
			res.Replayed = append(res.Replayed, replayed...)
			if err != nil {
				if errors.Is(err, ErrEventNotParked) && len(replayed) == 0 {
					continue // replayed or discarded meanwhile
				}
				if errors.Is(err, ErrParkedBehindHead) {
					res.Held = append(res.Held, p.EventID)
					continue
				}
				if failed.EventID == "" {
					failed = p
				}
				res.Failed = append(res.Failed, ParkedReplayFailure{EventID: failed.EventID, Position: failed.Position, Error: err.Error()})
				errs = append(errs, err)
				if !continueOnError {
					return res, errors.Join(errs...)
				}
			}
		}
		if filter.Limit > 0 {
			remaining -= len(page)
			if remaining <= 0 {
				break
			}
		}
		if len(page) < cursor.Limit {
			break
		}
	}
	return res, errors.Join(errs...)
}

// recordReplayFailure records a failed replay on a ManagedParkingLot.
// Its error is returned for ReplayParked to join to the handler's (and
// logged, since a failure to record must not go unnoticed).
func (s *Subscriber) recordReplayFailure(ctx context.Context, ev domain.EventEnvelope[any], herr error) error {
	lot, ok := s.parking.(ManagedParkingLot)
	if !ok {
		return nil
	}
	if err := lot.RecordReplayFailure(ctx, s.name, ev.ID, herr.Error(), time.Now().UTC()); err != nil {
		s.logger.Error("subscriber: recording a failed replay failed", append(s.eventAttrs(ev), "error", err)...)
		return err
	}
	return nil
}
