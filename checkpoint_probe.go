package subscriptions

import "context"

// CheckpointProbe is what a CheckpointProber reads of one subscriber name
// of one checkpoint store.
type CheckpointProbe struct {
	// Position is the committed checkpoint, as Position returns it (0
	// when the name has no checkpoint row).
	Position int64
	// Paused reports that the name's pause key (PauseKey) is paused
	// (Pauser).
	Paused bool
}

// CheckpointProber is the optional capability of a CheckpointStore that
// reads the checkpoints and pauses of many checkpoint stores of its kind
// on its database in one statement, on one connection: a Group's probe of
// its idle tenants once per poll interval, so that a reset, pause or
// resume made by another process (or the command line) on a tenant no
// event wakes is noticed within the interval. This package's stores and
// pgxstore.CheckpointStore have it; a Group uses it for a database whose
// first tenant's checkpoint store has it, and otherwise notices such a
// change at the tenant's next event.
//
// ProbeCheckpoints returns, for each of stores in order, one
// CheckpointProbe per name in order: what the store's Position and
// PausedSince(PauseKey(name)) would say, read together. A store it cannot
// read that way (of another kind, or another database it cannot reach) is
// an error wrapping errors.ErrUnsupported, and the caller then does
// without. Implementations are safe for concurrent use; they change
// nothing.
type CheckpointProber interface {
	ProbeCheckpoints(ctx context.Context, stores []CheckpointStore, names []string) ([][]CheckpointProbe, error)
}
