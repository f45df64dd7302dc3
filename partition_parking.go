package subscriptions

import (
	"context"
)

// partitionClearer is a partition's deliveredClearer: a live delivery in
// partition p of n removes the subscriber's parked entries in the batch's
// position range whose aggregate falls in p (PartitionOf), and only those.
// A partition's batch spans positions of other partitions' events too, so
// clearing by range alone, as an unpartitioned batch does, would remove
// entries that their own partitions have not delivered again yet.
//
// Entries are kept under the subscriber's own name (partitionLot), which
// the runner does not pass (it names the partition's checkpoint); name is
// it. An entry without an aggregate ID (parked before
// ParkedEvent.AggregateID existed) cannot be assigned to a partition and is
// never removed by a live delivery: ReplayParked refuses it while it lies
// past its partition's checkpoint, DiscardParked removes it.
//
// It is safe for concurrent use, as its lot is.
type partitionClearer struct {
	lot                   partitionDeliveredClearer
	name                  string
	partition, partitions int
}

// partitionDeliveredClearer is implemented by this package's parking lots
// (see partitionClearer).
type partitionDeliveredClearer interface {
	// clearPartitionDelivered is deliveredClearer.clearDelivered
	// restricted to the entries whose aggregate falls in partition of
	// partitions, through the batch transaction when ctx carries one of the
	// lot's database.
	clearPartitionDelivered(ctx context.Context, subscriber string, partition, partitions int, after, upTo int64) error
}

var _ deliveredClearer = partitionClearer{}

func (c partitionClearer) clearDelivered(ctx context.Context, _ string, after, upTo int64) error {
	return c.lot.clearPartitionDelivered(ctx, c.name, c.partition, c.partitions, after, upTo)
}

// clearsInBatch is the lot's (see deliveredClearer and runner.commit).
func (c partitionClearer) clearsInBatch(ctx context.Context) bool {
	if d, ok := c.lot.(interface{ clearsInBatch(context.Context) bool }); ok {
		return d.clearsInBatch(ctx)
	}
	return true
}
