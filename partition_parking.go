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
	lot                   PartitionDeliveredClearer
	name                  string
	partition, partitions int
}

// PartitionDeliveredClearer is the optional capability of a
// DeliveredClearer that removes only the entries of one partition's
// events: a partition's batch spans positions of other partitions' events
// (see partitionClearer). A partitioned subscriber uses it as its lot's
// DeliveredClearer; without it, it clears nothing on live delivery (as a
// lot without DeliveredClearer). This package's lots have it.
type PartitionDeliveredClearer interface {
	DeliveredClearer
	// ClearPartitionDelivered is ClearDelivered restricted to the entries
	// whose aggregate falls in partition of partitions (PartitionOf).
	ClearPartitionDelivered(ctx context.Context, subscriber string, partition, partitions int, after, upTo int64) error
}

var _ DeliveredClearer = partitionClearer{}

func (c partitionClearer) ClearDelivered(ctx context.Context, _ string, after, upTo int64) error {
	return c.lot.ClearPartitionDelivered(ctx, c.name, c.partition, c.partitions, after, upTo)
}

// ClearsInBatch is the lot's.
func (c partitionClearer) ClearsInBatch(ctx context.Context) bool { return c.lot.ClearsInBatch(ctx) }
