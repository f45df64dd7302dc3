package subscriptions

import (
	"context"
	"fmt"
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

var (
	_ partitionDeliveredClearer = (*GormParkingLot)(nil)
	_ partitionDeliveredClearer = (*MemoryParkingLot)(nil)
)

// clearPartitionDelivered on Postgres is one indexed DELETE, as
// clearDelivered is, with the partition's hash filter (dialect.PartitionHash
// on the entry's aggregate_id). SQLite has no MD5: the range's entries (in the
// usual case none: only a reset makes a live batch cover a parked event)
// are read through the batch transaction, filtered with PartitionOf, and
// the partition's deleted by key.
func (g *GormParkingLot) clearPartitionDelivered(ctx context.Context, subscriber string, partition, partitions int, after, upTo int64) error {
	db := g.batchTx(ctx)
	if db == nil {
		db = g.db
	}
	db = db.WithContext(ctx)
	what := func(err error) error {
		return fmt.Errorf("subscriptions: clear the parked events of %q (partition %d of %d) delivered in positions %d-%d: %w",
			subscriber, partition, partitions, after+1, upTo, err)
	}
	if hash := g.dialect.PartitionHash(); hash != "" { // the partition hash in SQL
		where, args := g.dialect.ParkedSubscriber(subscriber)
		if err := db.Exec("DELETE FROM parked_events WHERE "+where+" AND position > ? AND position <= ? AND aggregate_id <> '' AND mod("+hash+", ?) = ?",
			append(args, after, upTo, partitions, partition)...).Error; err != nil {
			return what(err)
		}
		return nil
	}
	var rows []struct {
		EventID     string
		AggregateID string
	}
	if err := db.Raw("SELECT event_id, aggregate_id FROM parked_events WHERE subscriber = ? AND position > ? AND position <= ?",
		subscriber, after, upTo).Scan(&rows).Error; err != nil {
		return what(err)
	}
	for _, row := range rows {
		if row.AggregateID == "" || PartitionOf(row.AggregateID, partitions) != partition {
			continue
		}
		if err := db.Exec("DELETE FROM parked_events WHERE subscriber = ? AND event_id = ?", subscriber, row.EventID).Error; err != nil {
			return what(fmt.Errorf("event %q: %w", row.EventID, err))
		}
	}
	return nil
}

// clearPartitionDelivered removes the partition's entries in (after, upTo],
// except one being replayed, as clearDelivered does.
func (m *MemoryParkingLot) clearPartitionDelivered(_ context.Context, subscriber string, partition, partitions int, after, upTo int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.entries {
		if k.subscriber == subscriber && !e.replaying && e.event.Position > after && e.event.Position <= upTo &&
			e.event.AggregateID != "" && PartitionOf(e.event.AggregateID, partitions) == partition {
			delete(m.entries, k)
		}
	}
	return nil
}
