package subscriptions

import (
	"context"
	"fmt"
	"sync"
)

// MemoryCheckpointStore is an in-memory CheckpointStore for tests and
// single-process development setups. It offers no transactional coupling
// with handler writes — handlers get at-least-once delivery.
//
// It is safe for concurrent use; at most one batch per subscriber name is
// active at a time.
type MemoryCheckpointStore struct {
	mu      sync.Mutex
	entries map[string]*memoryCheckpoint
}

type memoryCheckpoint struct {
	position int64
	active   *memoryBatch
}

// NewMemoryCheckpointStore creates an empty in-memory checkpoint store.
func NewMemoryCheckpointStore() *MemoryCheckpointStore {
	return &MemoryCheckpointStore{entries: make(map[string]*memoryCheckpoint)}
}

var _ CheckpointStore = (*MemoryCheckpointStore)(nil)

func (m *MemoryCheckpointStore) entry(subscriber string) *memoryCheckpoint {
	e, ok := m.entries[subscriber]
	if !ok {
		e = &memoryCheckpoint{}
		m.entries[subscriber] = e
	}
	return e
}

// Acquire begins a processing cycle; acquired is false while another batch
// for the same subscriber is active.
func (m *MemoryCheckpointStore) Acquire(ctx context.Context, subscriber string) (Batch, bool, error) {
	if err := validateName(subscriber); err != nil {
		return nil, false, fmt.Errorf("subscriptions: acquire: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("subscriptions: acquire checkpoint of %q: %w", subscriber, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entry(subscriber)
	if e.active != nil {
		return nil, false, nil
	}
	b := &memoryBatch{store: m, subscriber: subscriber, entry: e, position: e.position}
	e.active = b
	return b, true, nil
}

// Position returns the committed checkpoint for the subscriber.
func (m *MemoryCheckpointStore) Position(ctx context.Context, subscriber string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[subscriber]; ok {
		return e.position, nil
	}
	return 0, nil
}

// Reset sets the committed checkpoint. It fails with ErrBatchInFlight while
// a batch is in flight (an in-memory caller can simply stop the subscriber
// first, or retry).
func (m *MemoryCheckpointStore) Reset(ctx context.Context, subscriber string, position int64) error {
	if err := validateName(subscriber); err != nil {
		return fmt.Errorf("subscriptions: reset: %w", err)
	}
	if err := validatePosition(subscriber, position); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entry(subscriber)
	if e.active != nil {
		return fmt.Errorf("subscriptions: reset checkpoint of %q to %d: %w", subscriber, position, ErrBatchInFlight)
	}
	e.position = position
	return nil
}

type memoryBatch struct {
	store      *MemoryCheckpointStore
	subscriber string
	entry      *memoryCheckpoint
	position   int64
}

func (b *memoryBatch) Position() int64 { return b.position }

func (b *memoryBatch) HandlerContext(ctx context.Context) context.Context { return ctx }

func (b *memoryBatch) Commit(ctx context.Context, position int64) error {
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	if b.entry.active != b {
		return fmt.Errorf("subscriptions: commit checkpoint of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.entry.active = nil
	if position < b.position {
		return fmt.Errorf("subscriptions: commit checkpoint of %q: position %d is behind the batch's start %d", b.subscriber, position, b.position)
	}
	b.entry.position = position
	return nil
}

func (b *memoryBatch) Rollback() error {
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	if b.entry.active != b {
		return fmt.Errorf("subscriptions: roll back batch of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.entry.active = nil
	return nil
}

func (b *memoryBatch) Savepoint(context.Context, string) error           { return nil }
func (b *memoryBatch) RollbackToSavepoint(context.Context, string) error { return nil }
