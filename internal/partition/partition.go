// Package partition holds what the root package and the event stores
// share about partitions of the feed (subscriptions.WithPartitions): the
// hash that assigns an aggregate its partition, and the reads of one
// partition for a store that cannot filter in its own query language, by
// reading the whole feed in chunks and filtering with the hash.
package partition

import (
	"context"
	"crypto/md5"
	"encoding/binary"

	"github.com/eventfeed/subscriptions/domain"
)

// Of returns the partition, in [0, n), of an aggregate: the first four
// bytes of the MD5 digest of its ID's UTF-8 bytes, read as a big-endian
// unsigned integer, modulo n; 0 when n < 1. It is subscriptions.PartitionOf
// (which documents why it is fixed), and dialect.MD5PartitionHash is the
// same in SQL.
func Of(aggregateID string, n int) int {
	if n < 1 {
		return 0
	}
	sum := md5.Sum([]byte(aggregateID))
	return int(uint64(binary.BigEndian.Uint32(sum[:4])) % uint64(n))
}

// ReadChunk bounds one read of the unfiltered feed.
const ReadChunk = 1000

// Reader reads the whole feed past a position (an event store's
// ReadAfter).
type Reader func(ctx context.Context, after int64, limit int) ([]domain.EventEnvelope[any], error)

// ReadAfter returns up to limit events (limit <= 0: all) of partition p of
// n past after, in feed order, reading the feed in chunks of ReadChunk.
// The reader's rule that no position is returned while a smaller one can
// still commit holds for the result too.
func ReadAfter(ctx context.Context, read Reader, after int64, limit, p, n int) ([]domain.EventEnvelope[any], error) {
	out := []domain.EventEnvelope[any]{}
	cursor := after
	for {
		chunk, err := read(ctx, cursor, ReadChunk)
		if err != nil {
			return nil, err
		}
		for _, ev := range chunk {
			if Of(ev.AggregateID, n) == p {
				out = append(out, ev)
				if limit > 0 && len(out) == limit {
					return out, nil
				}
			}
		}
		if len(chunk) < ReadChunk {
			return out, nil
		}
		cursor = chunk[len(chunk)-1].Position
	}
}

// CountAfter counts the events of partition p of n in (after, head],
// reading the feed as ReadAfter does.
func CountAfter(ctx context.Context, read Reader, after, head int64, p, n int) (int64, error) {
	var count int64
	cursor := after
	for cursor < head {
		chunk, err := read(ctx, cursor, ReadChunk)
		if err != nil {
			return 0, err
		}
		for _, ev := range chunk {
			if ev.Position <= head && Of(ev.AggregateID, n) == p {
				count++
			}
		}
		if len(chunk) < ReadChunk {
			break
		}
		cursor = chunk[len(chunk)-1].Position
	}
	return count, nil
}
