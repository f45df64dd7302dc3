package subscriptions

import (
	"context"
	"time"
)

// adminStatus is one row of the admin surfaces' status table: the
// subscriber's Status, with the error that reading it met (the Status is
// then as far as it got; a table shows every subscriber, including the
// ones it cannot read), and which of its partitions are stuck, since
// Status itself says how long ago each last progressed but not whether
// that is too long.
type adminStatus struct {
	Status
	Error string `json:"error,omitempty"`
	// StuckPartitions are the partitions Healthy would report stuck
	// (events wait, and the checkpoint stood still longer than
	// WithStuckThreshold allows) while Run runs in this process.
	StuckPartitions []int `json:"stuck_partitions,omitempty"`
	// PartitionCount is WithPartitions' count (0 unpartitioned), for the
	// page to show even when Status could not be read.
	PartitionCount int `json:"-"`
	// stuckFor is how long each stuck partition's checkpoint has stood
	// still.
	stuckFor map[int]time.Duration
}

// adminSubscriberStatus reads s.Status for the admin surfaces.
func adminSubscriberStatus(ctx context.Context, s *Subscriber) adminStatus {
	st, progress, err := s.status(ctx)
	out := adminStatus{Status: st, PartitionCount: s.partitions}
	if err != nil {
		out.Subscriber, out.Error = s.name, err.Error()
	}
	if len(progress) != len(st.Partitions) {
		return out
	}
	for i, p := range st.Partitions {
		// Stopped: Run is not here to be stuck; halted: shown as failing.
		if p.State == StateStopped || p.State == StateHalted {
			continue
		}
		if still, _, stuck := s.stuckFor(p, progress[i]); stuck {
			if out.stuckFor == nil {
				out.stuckFor = map[int]time.Duration{}
			}
			out.StuckPartitions = append(out.StuckPartitions, p.Partition)
			out.stuckFor[p.Partition] = still.Round(time.Millisecond)
		}
	}
	return out
}

// StuckFor is how long partition p's checkpoint has stood still, as the
// page shows it, or "" when p is not stuck.
func (a adminStatus) StuckFor(p int) string {
	if d, ok := a.stuckFor[p]; ok {
		return d.String()
	}
	return ""
}

// FailingPartitions counts the partitions halted or retrying on an
// event, for the page's summary of a partitioned subscriber.
func (a adminStatus) FailingPartitions() int {
	n := 0
	for _, p := range a.Partitions {
		if p.State == StateHalted || p.State == StateRetrying || p.Failing != nil {
			n++
		}
	}
	return n
}

// PartitionsNeedAttention reports whether a partition is failing or stuck:
// the page then shows the partitions without being asked.
func (a adminStatus) PartitionsNeedAttention() bool {
	return len(a.StuckPartitions) > 0 || a.FailingPartitions() > 0
}

func (h *adminHandler) statuses(ctx context.Context) []adminStatus {
	out := make([]adminStatus, 0, len(h.names))
	for _, name := range h.names {
		out = append(out, adminSubscriberStatus(ctx, h.subs[name]))
	}
	return out
}
