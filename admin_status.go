package subscriptions

import (
	"context"
	"time"

	"github.com/eventfeed/subscriptions/internal/opstatus"
)

// adminSubscriberStatus is the one place the admin surfaces read a
// subscriber's status (see internal/opstatus): switch it to
// Subscriber.Status once that exists.
func adminSubscriberStatus(ctx context.Context, s *Subscriber) opstatus.Status {
	src := opstatus.Sources{Events: s.events, Position: func(ctx context.Context) (int64, error) {
		return s.checkpoints.Position(ctx, s.name)
	}}
	if s.parking != nil {
		src.Parked = func(ctx context.Context) (int, error) {
			p, err := s.parking.List(ctx, s.name)
			return len(p), err
		}
	}
	return opstatus.Read(ctx, s.name, src, time.Now())
}

func (h *adminHandler) statuses(ctx context.Context) []opstatus.Status {
	out := make([]opstatus.Status, 0, len(h.names))
	for _, name := range h.names {
		out = append(out, adminSubscriberStatus(ctx, h.subs[name]))
	}
	return out
}
