package subscriptions

import (
	"context"
	"sync"
)

// nameFences holds a checkpoint store's per-subscriber fences: while a
// ResetWith or Delete of a name runs, its fence stands, no batch of the
// name starts, and another ResetWith or Delete of the name waits for it to
// be lowered. The owning store's mutex guards the map.
type nameFences map[string]chan struct{}

// raise locks mu, waits until no fence stands for name and raises one. It
// returns with mu held, or with ctx's error and mu not held. mu is
// released while waiting.
func (f nameFences) raise(ctx context.Context, mu *sync.Mutex, name string) error {
	mu.Lock()
	for {
		pending := f[name]
		if pending == nil {
			f[name] = make(chan struct{})
			return nil
		}
		mu.Unlock()
		select {
		case <-pending:
			mu.Lock()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lower lowers name's fence and wakes the callers waiting for it. The
// caller holds the mutex guarding f.
func (f nameFences) lower(name string) {
	close(f[name])
	delete(f, name)
}
