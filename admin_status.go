package subscriptions

import (
	"context"
)

// adminStatus is one row of the admin surfaces' status table: the
// subscriber's Status, with the error that reading it met (the Status is
// then as far as it got; a table shows every subscriber, including the
// ones it cannot read).
type adminStatus struct {
	Status
	Error string `json:"error,omitempty"`
}

// adminSubscriberStatus reads s.Status for the admin surfaces.
func adminSubscriberStatus(ctx context.Context, s *Subscriber) adminStatus {
	st, err := s.Status(ctx)
	out := adminStatus{Status: st}
	if err != nil {
		out.Subscriber, out.Error = s.name, err.Error()
	}
	return out
}

func (h *adminHandler) statuses(ctx context.Context) []adminStatus {
	out := make([]adminStatus, 0, len(h.names))
	for _, name := range h.names {
		out = append(out, adminSubscriberStatus(ctx, h.subs[name]))
	}
	return out
}
