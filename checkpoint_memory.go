package subscriptions

import (
	"context"
	"fmt"
	"sync"
	"time"
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
	// fences stand while a ResetWith or Delete runs: no batch of the name
	// starts.
	fences nameFences
	// attempts are the attempt counts (checkpoint_attempts.go).
	attempts attemptTable
	// paused holds the paused names (see pauser), by pause key, with the
	// time of the pause.
	paused map[string]time.Time
}

type memoryCheckpoint struct {
	position int64
	active   *memoryBatch
}

// NewMemoryCheckpointStore creates an empty in-memory checkpoint store.
func NewMemoryCheckpointStore() *MemoryCheckpointStore {
	return &MemoryCheckpointStore{entries: make(map[string]*memoryCheckpoint), fences: make(nameFences)}
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
	if _, paused := m.paused[pauseKey(subscriber)]; e.active != nil || m.fences[subscriber] != nil || paused {
		return nil, false, nil
	}
	b := &memoryBatch{store: m, subscriber: subscriber, entry: e, position: e.position, done: make(chan struct{})}
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
// a batch is in flight, or a ResetWith or Delete of the subscriber runs
// (which would otherwise overwrite it); an in-memory caller can simply
// stop the subscriber first, or retry.
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
	if e.active != nil || m.fences[subscriber] != nil {
		return fmt.Errorf("subscriptions: reset checkpoint of %q to %d: %w", subscriber, position, ErrBatchInFlight)
	}
	e.position = position
	m.attempts.clear(subscriber)
	return nil
}

// ResetWith runs apply and sets the committed checkpoint (see
// CheckpointResetter). Unlike Reset it does not fail while a batch is in
// flight: it keeps new batches of the subscriber out, waits for the batch
// in flight to commit or roll back, then runs apply and moves the
// checkpoint before letting batches in again. Nothing is transactional in
// memory: apply's own writes are the application's to undo if it fails.
func (m *MemoryCheckpointStore) ResetWith(ctx context.Context, subscriber string, position int64, apply func(ctx context.Context) error) error {
	if err := validateName(subscriber); err != nil {
		return fmt.Errorf("subscriptions: reset: %w", err)
	}
	if err := validatePosition(subscriber, position); err != nil {
		return err
	}
	return m.fenced(ctx, subscriber, fmt.Sprintf("reset checkpoint of %q to %d", subscriber, position), apply, func(e *memoryCheckpoint) {
		e.position = position
	})
}

// Delete runs apply and forgets the subscriber's checkpoint, holding off
// batches as ResetWith does.
func (m *MemoryCheckpointStore) Delete(ctx context.Context, subscriber string, apply func(ctx context.Context) error) error {
	if err := validateName(subscriber); err != nil {
		return fmt.Errorf("subscriptions: delete checkpoint: %w", err)
	}
	return m.fenced(ctx, subscriber, fmt.Sprintf("delete checkpoint of %q", subscriber), apply, func(*memoryCheckpoint) {
		delete(m.entries, subscriber)
		delete(m.paused, pauseKey(subscriber))
	})
}

var _ pauser = (*MemoryCheckpointStore)(nil)

// pause records key as paused, so that no batch of it starts, then waits
// for the batches of names in flight to end (see pauser).
func (m *MemoryCheckpointStore) pause(ctx context.Context, key string, names []string, _ string) ([]int64, error) {
	m.mu.Lock()
	if m.paused == nil {
		m.paused = make(map[string]time.Time)
	}
	if _, ok := m.paused[key]; !ok {
		m.paused[key] = time.Now().UTC()
	}
	m.mu.Unlock()
	if err := m.fencedAll(ctx, names, fmt.Sprintf("pause %q", key), nil, func(*memoryCheckpoint) {}); err != nil {
		return nil, err
	}
	return m.positions(ctx, names)
}

func (m *MemoryCheckpointStore) resume(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.paused, key)
	return nil
}

func (m *MemoryCheckpointStore) pausedSince(_ context.Context, key string) (time.Time, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.paused[key]
	return at, ok, nil
}

// fenced holds off the subscriber's batches, waits for the one in flight,
// runs apply without holding m.mu (apply may call the store), and applies
// change under m.mu if apply succeeded. The fence is lifted by a deferred
// call, so that a panicking apply cannot leave the subscriber fenced
// forever.
func (m *MemoryCheckpointStore) fenced(ctx context.Context, subscriber, what string, apply func(ctx context.Context) error, change func(e *memoryCheckpoint)) error {
	// Another reset or delete of the subscriber goes first.
	if err := m.fences.raise(ctx, &m.mu, subscriber); err != nil {
		return fmt.Errorf("subscriptions: %s: waiting for another reset or delete: %w", what, err)
	}
	e := m.entry(subscriber)
	inFlight := e.active
	m.mu.Unlock()
	changed := false
	defer func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if changed {
			change(e)
			m.attempts.clear(subscriber)
		}
		m.fences.lower(subscriber)
	}()
	if inFlight != nil {
		select {
		case <-inFlight.done:
		case <-ctx.Done():
			return fmt.Errorf("subscriptions: %s: waiting for the batch in flight: %w", what, ctx.Err())
		}
	}
	if apply != nil {
		if err := apply(ctx); err != nil {
			return fmt.Errorf("subscriptions: %s: %w", what, applyError(err))
		}
	}
	changed = true
	return nil
}

type memoryBatch struct {
	store      *MemoryCheckpointStore
	subscriber string
	entry      *memoryCheckpoint
	position   int64
	done       chan struct{} // closed when the batch ends
	// clearAttempt: Commit clears the subscriber's attempt count.
	clearAttempt bool
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
	close(b.done)
	if position < b.position {
		return fmt.Errorf("subscriptions: commit checkpoint of %q: position %d is behind the batch's start %d", b.subscriber, position, b.position)
	}
	b.entry.position = position
	if b.clearAttempt {
		b.store.attempts.clear(b.subscriber)
	}
	return nil
}

func (b *memoryBatch) Rollback() error {
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	if b.entry.active != b {
		return fmt.Errorf("subscriptions: roll back batch of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.entry.active = nil
	close(b.done)
	return nil
}

func (b *memoryBatch) Savepoint(context.Context, string) error           { return nil }
func (b *memoryBatch) RollbackToSavepoint(context.Context, string) error { return nil }
