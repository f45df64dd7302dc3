package subscriptions

import (
	"context"
	"fmt"
	"slices"
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
	paused map[string]PauseRecord
	// catchUps are the catch-up marks (DeliveryMarker), by pause key.
	catchUps map[string]int64
}

type memoryCheckpoint struct {
	position int64
	// redelivered is the redelivery mark (DeliveryMarker).
	redelivered int64
	active      *memoryBatch
}

// moveTo is a reset of the checkpoint to position: the redelivery mark
// keeps the highest checkpoint the row had (see DeliveryMarker).
func (e *memoryCheckpoint) moveTo(position int64) {
	e.redelivered = max(e.redelivered, e.position)
	e.position = position
}

// NewMemoryCheckpointStore creates an empty in-memory checkpoint store.
func NewMemoryCheckpointStore() *MemoryCheckpointStore {
	return &MemoryCheckpointStore{entries: make(map[string]*memoryCheckpoint), fences: make(nameFences)}
}

var (
	_ CheckpointStore    = (*MemoryCheckpointStore)(nil)
	_ CheckpointResetter = (*MemoryCheckpointStore)(nil)
)

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
	if _, paused := m.paused[PauseKey(subscriber)]; e.active != nil || m.fences[subscriber] != nil || paused {
		return nil, false, nil
	}
	b := &memoryBatch{store: m, subscriber: subscriber, entry: e, position: e.position, done: make(chan struct{}),
		marks: DeliveryMarks{RedeliveredThrough: e.redelivered, CatchUpThrough: m.catchUps[PauseKey(subscriber)]}}
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
	e.moveTo(position)
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
		e.moveTo(position)
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
		delete(m.paused, PauseKey(subscriber))
		delete(m.catchUps, PauseKey(subscriber))
	})
}

var _ Pauser = (*MemoryCheckpointStore)(nil)

// Pause records key as paused, so that no batch of it starts, then waits
// for the batches of names in flight to end (see pauser).
func (m *MemoryCheckpointStore) Pause(ctx context.Context, key string, names []string, reason string) ([]int64, error) {
	m.mu.Lock()
	if m.paused == nil {
		m.paused = make(map[string]PauseRecord)
	}
	if _, ok := m.paused[key]; !ok {
		m.paused[key] = PauseRecord{Since: time.Now().UTC(), Reason: reason}
	}
	m.mu.Unlock()
	if err := m.fencedAll(ctx, names, fmt.Sprintf("pause %q, recorded (Resume lifts it)", key), nil, func(*memoryCheckpoint) {}); err != nil {
		return nil, err
	}
	return m.Positions(ctx, names)
}

func (m *MemoryCheckpointStore) Resume(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.paused, key)
	return nil
}

func (m *MemoryCheckpointStore) PausedSince(_ context.Context, key string) (PauseRecord, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.paused[key]
	return rec, ok, nil
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
	// marks are the row's as the batch was acquired.
	marks DeliveryMarks
}

var _ MarkedBatch = (*memoryBatch)(nil)

func (b *memoryBatch) DeliveryMarks() DeliveryMarks { return b.marks }

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

// MemoryCheckpointStore: the records live in the store, so replicas that
// share it share the count. clearAttempt takes effect when the batch
// commits.

var _ AttemptCounter = (*MemoryCheckpointStore)(nil)

func (m *MemoryCheckpointStore) BeginAttempt(_ context.Context, _ Batch, subscriber string, rec AttemptRecord) (AttemptRecord, bool, error) {
	prev, found := m.attempts.begin(subscriber, rec)
	return prev, found, nil
}

func (m *MemoryCheckpointStore) PutAttempt(_ context.Context, _ Batch, subscriber string, rec AttemptRecord) error {
	m.attempts.set(subscriber, rec)
	return nil
}

func (m *MemoryCheckpointStore) FailAttempt(_ context.Context, batch Batch, subscriber string, rec AttemptRecord) error {
	m.attempts.fail(subscriber, rec)
	return rollbackIf(batch)
}

func (m *MemoryCheckpointStore) HasAttempt(_ context.Context, _ Batch, subscriber string, position int64) (bool, error) {
	return m.attempts.has(subscriber, position), nil
}

func (m *MemoryCheckpointStore) ClearAttempt(_ context.Context, batch Batch, subscriber string) error {
	b, ok := batch.(*memoryBatch)
	if !ok {
		return fmt.Errorf("subscriptions: clear the attempt count of %q: not a batch of this store", subscriber)
	}
	b.clearAttempt = true
	return nil
}

var _ PartitionCheckpointStore = (*MemoryCheckpointStore)(nil)

func (m *MemoryCheckpointStore) Positions(_ context.Context, names []string) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int64, len(names))
	for i, name := range names {
		if e, ok := m.entries[name]; ok {
			out[i] = e.position
		}
	}
	return out, nil
}

// ResetAll with a nil apply refuses, changing nothing, while any of the
// names has a batch in flight (ErrBatchInFlight), as Reset does. With an
// apply it waits instead, as ResetWith does: every name is fenced (nested,
// in name order), apply runs, then every checkpoint moves.
func (m *MemoryCheckpointStore) ResetAll(ctx context.Context, names []string, position int64, guard, apply func(ctx context.Context) error) error {
	if len(names) == 0 {
		return nil
	}
	if err := validatePosition(names[0], position); err != nil {
		return err
	}
	what := fmt.Sprintf("reset %d checkpoints (%q ...) to %d", len(names), names[0], position)
	if apply != nil {
		return m.fencedAll(ctx, names, what, guarded(guard, apply), func(e *memoryCheckpoint) { e.moveTo(position) })
	}
	if err := guard(ctx); err != nil {
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, name := range names {
		if e := m.entries[name]; (e != nil && e.active != nil) || m.fences[name] != nil {
			return fmt.Errorf("subscriptions: reset checkpoint of %q to %d: %w", name, position, ErrBatchInFlight)
		}
	}
	for _, name := range names {
		m.entry(name).moveTo(position)
		m.attempts.clear(name)
	}
	return nil
}

// DeleteAll forgets every checkpoint after apply, holding off batches as
// resetAll with an apply does.
func (m *MemoryCheckpointStore) DeleteAll(ctx context.Context, names []string, guard, apply func(ctx context.Context) error) error {
	if len(names) == 0 {
		return nil
	}
	what := fmt.Sprintf("delete %d checkpoints (%q ...)", len(names), names[0])
	return m.fencedAll(ctx, names, what, guarded(guard, apply), func(e *memoryCheckpoint) {
		for name, entry := range m.entries {
			if entry == e {
				delete(m.entries, name)
				delete(m.paused, PauseKey(name))
				delete(m.catchUps, PauseKey(name))
			}
		}
	})
}

// fencedAll nests fenced over the names in order, so that apply runs once
// every name's batches are held off, and each change is made after it.
func (m *MemoryCheckpointStore) fencedAll(ctx context.Context, names []string, what string, apply func(ctx context.Context) error, change func(e *memoryCheckpoint)) error {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	var nest func(i int, ctx context.Context) error
	nest = func(i int, ctx context.Context) error {
		if i == len(sorted) {
			if apply == nil {
				return nil
			}
			return apply(ctx)
		}
		return m.fenced(ctx, sorted[i], what, func(ctx context.Context) error { return nest(i+1, ctx) }, change)
	}
	return nest(0, ctx)
}

func (m *MemoryCheckpointStore) InitPartitions(_ context.Context, marker, plain string, parts []string, n int64) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[marker]; e != nil && e.position != 0 {
		return e.position, nil
	}
	var seed memoryCheckpoint
	if e := m.entries[plain]; e != nil && e.position != RetiredCheckpoint {
		seed = *e
	}
	for _, part := range parts {
		if e, ok := m.entries[part]; !ok || e.position == RetiredCheckpoint {
			e := m.entry(part)
			e.position, e.redelivered = seed.position, seed.redelivered
		}
	}
	m.entry(marker).position = n
	return 0, nil
}

var _ DeliveryMarker = (*MemoryCheckpointStore)(nil)

// StartCatchUp records the catch-up mark unless key has one or one of
// rows has a checkpoint (see DeliveryMarker).
func (m *MemoryCheckpointStore) StartCatchUp(_ context.Context, key string, rows []string, through int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.catchUps[key]; ok {
		return nil
	}
	for _, row := range rows {
		if _, ok := m.entries[row]; ok {
			return nil
		}
	}
	if m.catchUps == nil {
		m.catchUps = make(map[string]int64)
	}
	m.catchUps[key] = through
	return nil
}
