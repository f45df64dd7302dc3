package subscriptions

import (
	"context"
	"fmt"
)

var _ Repartitioner = (*MemoryCheckpointStore)(nil)

// Repartition fences every row in name order (no batch of them starts,
// and the one in flight of each is waited for, as ResetWith does), reads
// them, runs catchUp and its apply, and then writes the layout. Nothing is
// transactional in memory: when apply fails, what its handlers did stays
// done (the checkpoints do not move, so those events are handled again,
// as after any failed batch of this store).
func (m *MemoryCheckpointStore) Repartition(ctx context.Context, marker string, from, to []string, count int64, catchUp RepartitionCatchUp) error {
	what := fmt.Sprintf("repartition %q", PauseKey(marker))
	all := layoutRows(marker, from, to)
	for _, name := range all {
		if err := validateName(name); err != nil {
			return fmt.Errorf("subscriptions: %s: %w", what, err)
		}
	}
	release, err := m.holdAll(ctx, all)
	if err != nil {
		return fmt.Errorf("subscriptions: %s: hold the batches: %w", what, err)
	}
	defer release()
	held := m.layout(marker, from)
	target, apply, err := catchUp(ctx, held, nil)
	if err == nil && apply != nil {
		err = apply(ctx)
	}
	if err != nil {
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, name := range from {
		m.entry(name).position = RetiredCheckpoint
	}
	for _, name := range to {
		e := m.entry(name)
		e.position, e.redelivered = target, held.LowestRedelivery()
	}
	for _, name := range all {
		m.attempts.clear(name)
	}
	m.entry(marker).position = count
	return nil
}

// layout reads the count's row and from's checkpoints and delivery marks
// (RepartitionRows).
func (m *MemoryCheckpointStore) layout(marker string, from []string) RepartitionRows {
	m.mu.Lock()
	defer m.mu.Unlock()
	held := RepartitionRows{Positions: make([]int64, len(from)), Marks: make([]DeliveryMarks, len(from))}
	if e, ok := m.entries[marker]; ok {
		held.Recorded = e.position
	}
	for i, name := range from {
		held.Marks[i].CatchUpThrough = m.catchUps[PauseKey(marker)]
		if e, ok := m.entries[name]; ok {
			held.Positions[i], held.Marks[i].RedeliveredThrough = e.position, e.redelivered
		}
	}
	return held
}

// holdAll raises the fences of names, in order, each once the batch in
// flight of it (if any) has ended, and returns what lowers them.
func (m *MemoryCheckpointStore) holdAll(ctx context.Context, names []string) (release func(), err error) {
	var raised []string
	release = func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, name := range raised {
			m.fences.lower(name)
		}
	}
	for _, name := range names {
		if err := m.fences.raise(ctx, &m.mu, name); err != nil {
			release()
			return nil, fmt.Errorf("waiting for a reset or delete of %q: %w", name, err)
		}
		raised = append(raised, name)
		var inFlight *memoryBatch
		if e := m.entries[name]; e != nil {
			inFlight = e.active
		}
		m.mu.Unlock()
		if inFlight != nil {
			select {
			case <-inFlight.done:
			case <-ctx.Done():
				release()
				return nil, fmt.Errorf("waiting for the batch in flight of %q: %w", name, ctx.Err())
			}
		}
	}
	return release, nil
}
