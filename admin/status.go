package admin

import (
	"context"
	"time"

	"github.com/eventfeed/subscriptions"
)

// statusRow is one row of the admin surfaces' status table: the
// subscriber's Status, with the error that reading it met (the Status is
// then as far as it got; a table shows every subscriber, including the
// ones it cannot read), and which of its partitions are stuck, since
// Status itself says how long ago each last progressed but not whether
// that is too long.
type statusRow struct {
	subscriptions.Status
	Error string `json:"error,omitempty"`
	// StuckPartitions are the partitions Healthy would report stuck
	// (events wait, and the checkpoint stood still longer than
	// WithStuckThreshold allows) while Run runs in this process.
	StuckPartitions []int `json:"stuck_partitions,omitempty"`
	// PartitionCount is WithPartitions' count (0 unpartitioned), for the
	// page to show even when Status could not be read.
	PartitionCount int `json:"-"`
	// Charts are the page's sparklines of the subscriber (nil before its
	// first sample, and in the API).
	Charts *charts `json:"-"`
	// stuckFor is how long each stuck partition's checkpoint has stood
	// still.
	stuckFor map[int]time.Duration
}

// readStatus reads t's status for the admin surfaces, with the stuck
// partitions by the root's own rule (Subscriber.StatusStuck, Healthy's),
// and its row's tenant.
func readStatus(ctx context.Context, t target) statusRow {
	st, stuck, err := t.s.StatusStuck(ctx)
	out := statusRow{Status: st, PartitionCount: t.s.Partitions()}
	if err != nil {
		out.Subscriber, out.Error = t.name, err.Error()
	}
	out.Tenant = t.tenant
	for _, c := range stuck {
		if c.Partition < 0 {
			continue // an unpartitioned subscriber's checkpoint
		}
		if out.stuckFor == nil {
			out.stuckFor = map[int]time.Duration{}
		}
		out.StuckPartitions = append(out.StuckPartitions, c.Partition)
		out.stuckFor[c.Partition] = c.Still.Round(time.Millisecond)
	}
	return out
}

// StuckFor is how long partition p's checkpoint has stood still, as the
// page shows it, or "" when p is not stuck.
func (a statusRow) StuckFor(p int) string {
	if d, ok := a.stuckFor[p]; ok {
		return d.String()
	}
	return ""
}

// FailingPartitions counts the partitions halted or retrying on an
// event, for the page's summary of a partitioned subscriber.
func (a statusRow) FailingPartitions() int {
	n := 0
	for _, p := range a.Partitions {
		if p.State == subscriptions.StateHalted || p.State == subscriptions.StateRetrying || p.Failing != nil {
			n++
		}
	}
	return n
}

// PartitionsNeedAttention reports whether a partition is failing or stuck:
// the page then shows the partitions without being asked.
func (a statusRow) PartitionsNeedAttention() bool {
	return len(a.StuckPartitions) > 0 || a.FailingPartitions() > 0
}

// statuses reads the rows keys, one after another. A row whose
// subscriber is gone (a tenant removed since keys were listed) is left
// out.
func (h *Handler) statuses(ctx context.Context, keys []key) []statusRow {
	out := make([]statusRow, 0, len(keys))
	for _, k := range keys {
		if s, ref := h.src.lookup(k); ref == nil {
			out = append(out, readStatus(ctx, target{k, s}))
		}
	}
	return out
}
