package subscriptions

import (
	"context"
	"slices"
	"sync"
)

// partitionIndexChunk is how many positions one read of the feed adds to a
// partitionIndex.
const partitionIndexChunk = 2000

// partitionIndexCap bounds the positions a partitionIndex holds (8 bytes
// each); past it the oldest chunks are dropped, and a partition whose
// checkpoint is behind what is left reads with the hash filter again.
const partitionIndexCap = 1 << 17

// partitionIndex maps a window of the feed's positions to their partitions
// for the workers of one partitioned Run on a FeedIndex, so that a
// partition's batch reads its own events by position (an index lookup per
// event) instead of filtering the feed (see FeedIndex).
//
// The window (lo, hi] is complete: pos[p] holds every position in it whose
// aggregate is in partition p, in order. It is filled by reading the feed
// past hi (positions and aggregate IDs only, hashed in Go), which the
// events table's ordered feed makes final: appends commit in position
// order, so no position at or below a read's last can appear later (see
// GormEventStore). A read for a checkpoint below lo, or one the window
// cannot answer within partitionIndexCap, says so, and the caller reads
// with the hash filter, which is always correct.
//
// It is safe for concurrent use: mu guards the window, fill serializes the
// reads of the feed (one worker reads for all; the others wait for it).
type partitionIndex struct {
	feed       FeedIndex
	partitions int
	// chunk and capacity are partitionIndexChunk and partitionIndexCap
	// (smaller in tests).
	chunk, capacity int

	fill sync.Mutex

	mu      sync.Mutex
	started bool
	lo, hi  int64
	pos     [][]int64
	size    int
	// chunks are the last positions of the fills still held, oldest first:
	// the window drops whole chunks.
	chunks []int64
}

func newPartitionIndex(feed FeedIndex, partitions int) *partitionIndex {
	return &partitionIndex{feed: feed, partitions: partitions, chunk: partitionIndexChunk, capacity: partitionIndexCap, pos: make([][]int64, partitions)}
}

// positionsAfter returns the first limit positions of partition p past
// after (fewer when the feed holds fewer now). ok is false when the window
// cannot answer: the caller then reads with the hash filter.
func (x *partitionIndex) positionsAfter(ctx context.Context, p int, after int64, limit int) (out []int64, ok bool, err error) {
	if limit <= 0 {
		return nil, false, nil
	}
	if out, ok, done := x.lookup(p, after, limit); done {
		return out, ok, nil
	}
	// Read the feed, always once at least: a read that found fewer than
	// limit must see every event committed before it was asked for, as
	// the hash-filtered read would.
	x.fill.Lock()
	defer x.fill.Unlock()
	for {
		x.mu.Lock()
		from := x.hi
		x.mu.Unlock()
		n, err := x.extend(ctx, from)
		if err != nil {
			return nil, false, err
		}
		out, ok, done := x.lookup(p, after, limit)
		if done || n < x.chunk {
			// Caught up with the feed (or unable to answer): a short list
			// is the whole answer.
			return out, ok, nil
		}
	}
}

// lookup answers from the window: done is true when it could (ok false:
// the checkpoint is below the window, read with the hash filter).
func (x *partitionIndex) lookup(p int, after int64, limit int) (out []int64, ok, done bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case !x.started || after > x.hi+int64(x.capacity) || (after < x.lo && x.size == 0):
		// First use, a checkpoint far past the window (another replica
		// handled those events), or below an empty one: start the window
		// there.
		x.restart(after)
	case after < x.lo:
		return nil, false, true
	}
	list := x.pos[p]
	i, _ := slices.BinarySearch(list, after+1)
	list = list[i:]
	if len(list) >= limit {
		return slices.Clone(list[:limit]), true, true
	}
	return slices.Clone(list), true, false
}

// start starts the window at position unless it has started: the lowest
// partition checkpoint, when Run knows it, so that every partition reads
// through the window from its first batch. Nothing else need be held.
func (x *partitionIndex) start(position int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.started {
		x.restart(position)
	}
}

// rewind restarts the window at lowest when every partition's checkpoint
// (lowest to highest) is behind it, as after a reset or a rebuild in place:
// otherwise every partition would read with the hash filter until it
// reached the old window. A window some partition still reads from is
// kept. The coordinator's sweep calls it with the checkpoints it read.
func (x *partitionIndex) rewind(lowest, highest int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.started && highest < x.lo {
		x.restart(lowest)
	}
}

// restart empties the window at position; the caller holds x.mu.
func (x *partitionIndex) restart(position int64) {
	x.started, x.lo, x.hi, x.size, x.chunks = true, position, position, 0, nil
	for i := range x.pos {
		x.pos[i] = nil
	}
}

// extend reads the feed's positions past from into the window and returns
// how many it read. The caller holds x.fill.
func (x *partitionIndex) extend(ctx context.Context, from int64) (int, error) {
	positions, aggregates, err := x.feed.ReadAggregatesAfter(ctx, from, x.chunk)
	if err != nil {
		return 0, err // the store says what it read
	}
	if len(positions) == 0 {
		return 0, nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.hi != from {
		return len(positions), nil // the window was restarted meanwhile
	}
	for i, position := range positions {
		p := PartitionOf(aggregates[i], x.partitions)
		x.pos[p] = append(x.pos[p], position)
	}
	x.hi = positions[len(positions)-1]
	x.size += len(positions)
	x.chunks = append(x.chunks, x.hi)
	for x.size > x.capacity && len(x.chunks) > 1 {
		x.lo, x.chunks = x.chunks[0], x.chunks[1:]
		x.size = 0
		for i, list := range x.pos {
			j, _ := slices.BinarySearch(list, x.lo+1)
			x.pos[i] = slices.Clone(list[j:])
			x.size += len(x.pos[i])
		}
	}
	return len(positions), nil
}
