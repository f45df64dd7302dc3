package infrastructure

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/partition"
)

// MemoryStore is an in-memory domain.EventStore for tests and
// single-process use. It implements every method, including the global
// ordered feed: positions are dense (1, 2, 3, ...) and assigned under one
// lock, so the feed order is the append order.
//
// MemoryStore is safe for concurrent use. Envelopes come back as they were
// appended (payloads are not round-tripped through JSON, though Append
// refuses what could not be encoded as JSON, exactly as GormEventStore
// does); callers must treat returned payloads and metadata as read-only.
type MemoryStore struct {
	mu     sync.RWMutex
	events []domain.EventEnvelope[any] // events[i].Position == i+1
	byID   map[string]int
	byAgg  map[string][]int
	byTx   map[string][]int
	closed bool
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		byID:  make(map[string]int),
		byAgg: make(map[string][]int),
		byTx:  make(map[string][]int),
	}
}

var _ domain.EventStore = (*MemoryStore)(nil)

// Append stores events for one aggregate atomically; see domain.EventStore.
func (m *MemoryStore) Append(ctx context.Context, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("append to aggregate %q: %w", aggregateID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed
	}
	// Input first, then stored IDs (a retry's version is stale by
	// construction), then the version.
	given, err := pgevents.PrepareAppend(aggregateID, expectedVersion, -1, events)
	if err != nil {
		return err
	}
	stored := map[string]pgevents.Stored{}
	for _, ev := range events {
		if idx, dup := m.byID[ev.ID]; dup {
			e := m.events[idx]
			payload, err := pgevents.EncodeJSON(e.Payload)
			if err != nil {
				return fmt.Errorf("append to aggregate %q: encode stored event %q: %w", aggregateID, e.ID, err)
			}
			stored[e.ID] = pgevents.Stored{ID: e.ID, AggregateID: e.AggregateID, EventType: e.EventType,
				TransactionID: e.TransactionID, SequenceNo: e.SequenceNo, Payload: payload}
		}
	}
	if err := pgevents.CheckStoredIDs(aggregateID, expectedVersion, events, given, stored); err != nil {
		return err
	}
	prepared, err := pgevents.PrepareAppend(aggregateID, expectedVersion, len(m.byAgg[aggregateID]), events)
	if err != nil {
		return err
	}
	for _, p := range prepared {
		env := p.Envelope
		env.Metadata = cloneMetadata(env.Metadata)
		idx := len(m.events)
		env.Position = int64(idx + 1)
		m.events = append(m.events, env)
		m.byID[env.ID] = idx
		m.byAgg[aggregateID] = append(m.byAgg[aggregateID], idx)
		if env.TransactionID != "" {
			m.byTx[env.TransactionID] = append(m.byTx[env.TransactionID], idx)
		}
	}
	return nil
}

func cloneMetadata(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// GetEvents returns every event of the aggregate in sequence order.
func (m *MemoryStore) GetEvents(ctx context.Context, aggregateID string) ([]domain.EventEnvelope[any], error) {
	return m.GetEventsRange(ctx, aggregateID, -1, -1)
}

// GetEventsFromVersion returns the aggregate's events with sequence
// number >= fromVersion.
func (m *MemoryStore) GetEventsFromVersion(ctx context.Context, aggregateID string, fromVersion int) ([]domain.EventEnvelope[any], error) {
	return m.GetEventsRange(ctx, aggregateID, fromVersion, -1)
}

// GetEventsRange returns the aggregate's events with sequence numbers in
// [fromVersion, toVersion]; -1 means 1 for fromVersion and "to the end" for
// toVersion.
func (m *MemoryStore) GetEventsRange(ctx context.Context, aggregateID string, fromVersion, toVersion int) ([]domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return nil, err
	}
	from, to, err := pgevents.CheckVersionRange(aggregateID, fromVersion, toVersion)
	if err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	idxs := m.byAgg[aggregateID]
	out := []domain.EventEnvelope[any]{}
	// Sequence numbers are dense from 1, so idxs[seq-1] is event seq.
	for seq := from; seq <= len(idxs) && (to < 0 || seq <= to); seq++ {
		out = append(out, m.events[idxs[seq-1]])
	}
	return out, nil
}

// GetEventByID returns the event with the given ID or an error wrapping
// domain.ErrEventNotFound.
func (m *MemoryStore) GetEventByID(ctx context.Context, eventID string) (domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("event ID", eventID); err != nil {
		return domain.EventEnvelope[any]{}, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return domain.EventEnvelope[any]{}, errClosed
	}
	idx, ok := m.byID[eventID]
	if !ok {
		return domain.EventEnvelope[any]{}, fmt.Errorf("%w: event ID %q", domain.ErrEventNotFound, eventID)
	}
	return m.events[idx], nil
}

// GetEventsByTransactionID returns the transaction's events ordered by
// aggregate ID, then sequence number.
func (m *MemoryStore) GetEventsByTransactionID(ctx context.Context, transactionID string) ([]domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("transaction ID", transactionID); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	out := make([]domain.EventEnvelope[any], 0, len(m.byTx[transactionID]))
	for _, idx := range m.byTx[transactionID] {
		out = append(out, m.events[idx])
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].AggregateID != out[j].AggregateID {
			return out[i].AggregateID < out[j].AggregateID
		}
		return out[i].SequenceNo < out[j].SequenceNo
	})
	return out, nil
}

// GetCurrentVersion returns the aggregate's last sequence number, 0 when it
// does not exist.
func (m *MemoryStore) GetCurrentVersion(ctx context.Context, aggregateID string) (int, error) {
	if err := pgevents.CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, errClosed
	}
	return len(m.byAgg[aggregateID]), nil
}

// ReadAfter returns up to limit events (all when limit <= 0) with Position
// > afterPosition in position order. Positions are dense, so the start is
// found in O(1) and the cost is O(limit), whatever the history's length.
func (m *MemoryStore) ReadAfter(ctx context.Context, afterPosition int64, limit int) ([]domain.EventEnvelope[any], error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("read after position %d: %w", afterPosition, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	if afterPosition < 0 {
		afterPosition = 0
	}
	start := len(m.events)
	if afterPosition < int64(len(m.events)) {
		start = int(afterPosition)
	}
	end := len(m.events)
	if limit > 0 && end-start > limit {
		end = start + limit
	}
	out := make([]domain.EventEnvelope[any], end-start)
	copy(out, m.events[start:end])
	return out, nil
}

// HeadPosition returns the highest position stored, 0 when empty.
func (m *MemoryStore) HeadPosition(ctx context.Context) (int64, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, errClosed
	}
	return int64(len(m.events)), nil
}

// Close releases the store; later calls fail.
func (m *MemoryStore) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// ReadPartitionAfter returns up to limit events (all when limit <= 0) of
// partition p of n with Position > afterPosition, in position order (see
// GormEventStore.ReadPartitionAfter).
func (m *MemoryStore) ReadPartitionAfter(ctx context.Context, afterPosition int64, limit, p, n int) ([]domain.EventEnvelope[any], error) {
	return partition.ReadAfter(ctx, m.ReadAfter, afterPosition, limit, p, n)
}

// CountPartitionAfter counts the events of partition p of n in (after,
// head].
func (m *MemoryStore) CountPartitionAfter(ctx context.Context, after, head int64, p, n int) (int64, error) {
	return partition.CountAfter(ctx, m.ReadAfter, after, head, p, n)
}

// ReadAggregatesAfter returns the positions and aggregate IDs of up to
// limit events past afterPosition, in position order.
func (m *MemoryStore) ReadAggregatesAfter(ctx context.Context, afterPosition int64, limit int) ([]int64, []string, error) {
	events, err := m.ReadAfter(ctx, afterPosition, limit)
	if err != nil {
		return nil, nil, err
	}
	positions, aggregates := make([]int64, len(events)), make([]string, len(events))
	for i, ev := range events {
		positions[i], aggregates[i] = ev.Position, ev.AggregateID
	}
	return positions, aggregates, nil
}

// ReadPositions returns the events at positions, in position order; a
// position without an event is left out.
func (m *MemoryStore) ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("read %d events by position: %w", len(positions), err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, errClosed
	}
	out := make([]domain.EventEnvelope[any], 0, len(positions))
	for _, p := range slices.Sorted(slices.Values(positions)) {
		if p >= 1 && p <= int64(len(m.events)) {
			out = append(out, m.events[p-1])
		}
	}
	return out, nil
}
