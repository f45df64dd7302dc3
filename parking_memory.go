package subscriptions

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// MemoryParkingLot is an in-memory ParkingLot for tests and single-process
// development setups. Parking is not transactional with checkpoint
// advances, and parked records do not survive a restart — pairing it with a
// durable checkpoint store means a poison event whose park record is lost
// on restart has already been skipped by the durable checkpoint,
// permanently.
//
// It is safe for concurrent use.
type MemoryParkingLot struct {
	mu      sync.Mutex
	entries map[parkedKey]*memoryParked
}

type parkedKey struct{ subscriber, eventID string }

type memoryParked struct {
	event     ParkedEvent // HeldBy empty: see view
	version   uint64      // bumped by every Park, so a replay can tell a re-park
	replaying bool
	held      bool // held behind its queue's head (Hold)
}

// NewMemoryParkingLot creates an empty in-memory parking lot.
func NewMemoryParkingLot() *MemoryParkingLot {
	return &MemoryParkingLot{entries: make(map[parkedKey]*memoryParked)}
}

var (
	_ ParkingLot                = (*MemoryParkingLot)(nil)
	_ ParkingLotPurger          = (*MemoryParkingLot)(nil)
	_ ParkedCounter             = (*MemoryParkingLot)(nil)
	_ PartitionDeliveredClearer = (*MemoryParkingLot)(nil)
	_ OrderedParkingLot         = (*MemoryParkingLot)(nil)
)

// Park records a poison event; parking it again updates its type,
// position, error, attempt count and time.
func (m *MemoryParkingLot) Park(ctx context.Context, parked ParkedEvent) error {
	if err := validateParked(parked); err != nil {
		return err
	}
	if parked.ParkedAt.IsZero() {
		parked.ParkedAt = time.Now().UTC()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.put(parked, false)
	return nil
}

// put parks p, or updates its entry; the caller holds m.mu.
func (m *MemoryParkingLot) put(p ParkedEvent, held bool) {
	p.HeldBy = ""
	k := parkedKey{p.Subscriber, p.EventID}
	e, ok := m.entries[k]
	if !ok {
		e = &memoryParked{}
		m.entries[k] = e
	}
	e.event, e.held = p, held
	e.version++
}

// first returns the first entry of subscriber's queue of aggregate, nil
// when it has none; the caller holds m.mu.
func (m *MemoryParkingLot) first(subscriber, aggregate string) *memoryParked {
	var out *memoryParked
	for k, e := range m.entries {
		if k.subscriber != subscriber || aggregate == "" || e.event.AggregateID != aggregate {
			continue
		}
		if out == nil || e.event.Position < out.event.Position ||
			e.event.Position == out.event.Position && e.event.EventID < out.event.EventID {
			out = e
		}
	}
	return out
}

// remove deletes an entry and makes the next of its queue the head (see
// OrderedParkingLot); the caller holds m.mu.
func (m *MemoryParkingLot) remove(k parkedKey) {
	e, ok := m.entries[k]
	if !ok {
		return
	}
	delete(m.entries, k)
	if next := m.first(k.subscriber, e.event.AggregateID); next != nil {
		next.held = false
	}
}

// view is the entry as reads return it: a held one names its queue's
// head; the caller holds m.mu.
func (m *MemoryParkingLot) view(k parkedKey, e *memoryParked) ParkedEvent {
	p := e.event
	if e.held {
		if head := m.first(k.subscriber, p.AggregateID); head != nil && head != e {
			p.HeldBy = head.event.EventID
		}
	}
	return p
}

// ParkedHeads returns the first entry of each of the subscriber's queues
// (OrderedParkingLot).
func (m *MemoryParkingLot) ParkedHeads(_ context.Context, subscriber string) ([]ParkedEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	heads := map[string]*memoryParked{}
	for k, e := range m.entries {
		if k.subscriber == subscriber && e.event.AggregateID != "" {
			if h := heads[e.event.AggregateID]; h == nil {
				heads[e.event.AggregateID] = m.first(subscriber, e.event.AggregateID)
			}
		}
	}
	out := make([]ParkedEvent, 0, len(heads))
	for _, h := range heads {
		out = append(out, h.event)
	}
	return out, nil
}

// Hold parks held behind the first entry of its aggregate's queue, if
// that lies before it (OrderedParkingLot).
func (m *MemoryParkingLot) Hold(_ context.Context, held ParkedEvent) (string, error) {
	if err := validateParked(held); err != nil {
		return "", err
	}
	if held.ParkedAt.IsZero() {
		held.ParkedAt = time.Now().UTC()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	head := m.first(held.Subscriber, held.AggregateID)
	if head == nil || head.event.Position >= held.Position {
		return "", nil
	}
	m.put(held, true)
	return head.event.EventID, nil
}

// CountHeld returns how many of the subscriber's entries are held
// (OrderedParkingLot).
func (m *MemoryParkingLot) CountHeld(_ context.Context, subscriber string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, e := range m.entries {
		if k.subscriber == subscriber && e.held {
			n++
		}
	}
	return n, nil
}

var _ DeliveredClearer = (*MemoryParkingLot)(nil)

// ClearDelivered removes the subscriber's entries in (after, upTo] (see
// deliveredClearer), except one being replayed: the replay decides.
func (m *MemoryParkingLot) ClearDelivered(_ context.Context, subscriber string, after, upTo int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.entries {
		if k.subscriber == subscriber && !e.replaying && e.event.Position > after && e.event.Position <= upTo {
			m.remove(k)
		}
	}
	return nil
}

// ClearsInBatch implements deliveredClearer: a MemoryParkingLot never
// joins a batch transaction.
func (m *MemoryParkingLot) ClearsInBatch(context.Context) bool { return false }

// List returns the subscriber's parked events ordered by position.
func (m *MemoryParkingLot) List(ctx context.Context, subscriber string) ([]ParkedEvent, error) {
	m.mu.Lock()
	out := []ParkedEvent{}
	for k, e := range m.entries {
		if k.subscriber == subscriber {
			out = append(out, m.view(k, e))
		}
	}
	m.mu.Unlock()
	sortParked(out)
	return out, nil
}

// CountParked returns how many events the subscriber has parked (see Status).
func (m *MemoryParkingLot) CountParked(_ context.Context, subscriber string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k := range m.entries {
		if k.subscriber == subscriber {
			n++
		}
	}
	return n, nil
}

func sortParked(p []ParkedEvent) {
	sort.Slice(p, func(i, j int) bool {
		if p[i].Position != p[j].Position {
			return p[i].Position < p[j].Position
		}
		return p[i].EventID < p[j].EventID
	})
}

// Replay re-runs the handler and clears the parked entry on success. The
// handler runs at most once per entry: concurrent replays of the same event
// conflict (ErrReplayInProgress) instead of double-executing, and an entry
// re-parked while the replay was running (a fresh failure) is preserved
// rather than cleared.
func (m *MemoryParkingLot) Replay(ctx context.Context, subscriber, eventID string, event domain.EventEnvelope[any], handler Handler) error {
	if handler == nil {
		return fmt.Errorf("subscriptions: replay event %q for %q: nil handler", eventID, subscriber)
	}
	k := parkedKey{subscriber, eventID}
	m.mu.Lock()
	e, ok := m.entries[k]
	switch {
	case !ok:
		m.mu.Unlock()
		return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, ErrEventNotParked)
	case e.replaying:
		m.mu.Unlock()
		return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, ErrReplayInProgress)
	}
	e.replaying = true
	version := e.version
	m.mu.Unlock()

	succeeded := false
	defer func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		e.replaying = false
		if succeeded && e.version == version && m.entries[k] == e {
			m.remove(k)
		}
	}()
	if err := handler(ctx, event); err != nil {
		return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, err)
	}
	succeeded = true
	return nil
}

// Purge deletes every event parked for subscriber.
func (m *MemoryParkingLot) Purge(ctx context.Context, subscriber string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.entries {
		if k.subscriber == subscriber {
			delete(m.entries, k)
		}
	}
	return nil
}

var _ ManagedParkingLot = (*MemoryParkingLot)(nil)

// Get returns one parked entry.
func (m *MemoryParkingLot) Get(ctx context.Context, subscriber, eventID string) (ParkedEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := parkedKey{subscriber, eventID}
	e, ok := m.entries[k]
	if !ok {
		return ParkedEvent{}, fmt.Errorf("subscriptions: parked event %q of %q: %w", eventID, subscriber, ErrEventNotParked)
	}
	return m.view(k, e), nil
}

// ListFiltered returns the subscriber's parked events matching filter in
// position order.
func (m *MemoryParkingLot) ListFiltered(ctx context.Context, subscriber string, filter ParkedFilter) ([]ParkedEvent, error) {
	m.mu.Lock()
	out := []ParkedEvent{}
	for k, e := range m.entries {
		if k.subscriber == subscriber && filter.matches(e.event) {
			out = append(out, m.view(k, e))
		}
	}
	m.mu.Unlock()
	sortParked(out)
	if filter.Limit > 0 && len(out) > filter.Limit {
		out = out[:filter.Limit]
	}
	return out, nil
}

// matches applies every part of the filter but Limit.
func (f ParkedFilter) matches(p ParkedEvent) bool {
	return p.Position > f.AfterPosition &&
		(f.EventType == "" || p.EventType == f.EventType) &&
		(f.AggregateID == "" || p.AggregateID == f.AggregateID)
}

// Discard removes a parked entry; an entry being replayed is refused with
// ErrReplayInProgress.
func (m *MemoryParkingLot) Discard(ctx context.Context, subscriber, eventID string) (ParkedEvent, error) {
	k := parkedKey{subscriber, eventID}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[k]
	switch {
	case !ok:
		return ParkedEvent{}, fmt.Errorf("subscriptions: discard event %q of %q: %w", eventID, subscriber, ErrEventNotParked)
	case e.replaying:
		return ParkedEvent{}, fmt.Errorf("subscriptions: discard event %q of %q: %w", eventID, subscriber, ErrReplayInProgress)
	}
	p := m.view(k, e)
	m.remove(k)
	return p, nil
}

// RecordReplayFailure counts a failed replay on the entry, if it is still
// parked.
func (m *MemoryParkingLot) RecordReplayFailure(ctx context.Context, subscriber, eventID, errText string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[parkedKey{subscriber, eventID}]; ok {
		e.event.Attempts++
		e.event.Error = errText
		e.event.ParkedAt = at.UTC()
	}
	return nil
}

// ClearPartitionDelivered removes the partition's entries in (after, upTo],
// except one being replayed, as clearDelivered does.
func (m *MemoryParkingLot) ClearPartitionDelivered(_ context.Context, subscriber string, partition, partitions int, after, upTo int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.entries {
		if k.subscriber == subscriber && !e.replaying && e.event.Position > after && e.event.Position <= upTo &&
			e.event.AggregateID != "" && PartitionOf(e.event.AggregateID, partitions) == partition {
			m.remove(k)
		}
	}
	return nil
}
