package subscriptions

import (
	"context"
	"errors"
	"fmt"
)

var _ CheckpointProber = (*MemoryCheckpointStore)(nil)

// ProbeCheckpoints reads stores, which must all be MemoryCheckpointStores
// (else the error wraps errors.ErrUnsupported), each under its own lock:
// see CheckpointProber.
func (m *MemoryCheckpointStore) ProbeCheckpoints(_ context.Context, stores []CheckpointStore, names []string) ([][]CheckpointProbe, error) {
	mems := make([]*MemoryCheckpointStore, len(stores))
	for i, store := range stores {
		mem, ok := store.(*MemoryCheckpointStore)
		if !ok || mem == nil {
			return nil, fmt.Errorf("subscriptions: probe checkpoints: store %d (%T) is not a MemoryCheckpointStore: %w", i, store, errors.ErrUnsupported)
		}
		mems[i] = mem
	}
	out := make([][]CheckpointProbe, len(mems))
	for i, mem := range mems {
		out[i] = make([]CheckpointProbe, len(names))
		mem.mu.Lock()
		for j, name := range names {
			if e, ok := mem.entries[name]; ok {
				out[i][j].Position = e.position
			}
			_, out[i][j].Paused = mem.paused[PauseKey(name)]
		}
		mem.mu.Unlock()
	}
	return out, nil
}
