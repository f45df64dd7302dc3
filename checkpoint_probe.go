package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/eventfeed/subscriptions/internal/ckprobe"
)

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

var (
	_ CheckpointProber = (*MemoryCheckpointStore)(nil)
	_ CheckpointProber = (*GormCheckpointStore)(nil)
)

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

// ProbeCheckpoints reads the checkpoint and pause rows of names in every
// one of stores in one statement on this store's pool (see
// CheckpointProber). On Postgres, stores must be GormCheckpointStores on
// Postgres on this store's database: each store's tables are named in its
// own schema (WithSchema's, or the one its pool's search_path selects,
// resolved on that pool by the store's first probe, once), and read
// through this store's connection; a store of another database whose
// schema this one lacks fails the statement. On SQLite every store must
// be on this store's pool. Any other store is an error wrapping
// errors.ErrUnsupported. Safe for concurrent use.
func (g *GormCheckpointStore) ProbeCheckpoints(ctx context.Context, stores []CheckpointStore, names []string) ([][]CheckpointProbe, error) {
	tables := make([]ckprobe.Tables, len(stores))
	for i, store := range stores {
		other, ok := store.(*GormCheckpointStore)
		if !ok || other == nil || other.dialect != g.dialect || (!g.dialect.RowLocks && other.pool != g.pool) {
			return nil, fmt.Errorf("subscriptions: probe checkpoints: store %d (%T) is not a GormCheckpointStore on this store's database: %w", i, store, errors.ErrUnsupported)
		}
		t, err := other.probeTables(ctx)
		if err != nil {
			return nil, fmt.Errorf("subscriptions: probe checkpoints: store %d: %w", i, err)
		}
		tables[i] = ckprobe.Tables{Checkpoints: t.checkpoints, Pauses: t.pauses}
	}
	if len(stores) == 0 || len(names) == 0 {
		return emptyProbes(len(stores), len(names)), nil
	}
	keys := pauseKeys(names)
	args := make([]any, 0, 2*len(stores))
	for range tables {
		args = append(args, names, keys)
	}
	rows, err := g.db.WithContext(ctx).Raw(ckprobe.Query(tables, "?", "?"), args...).Rows()
	if err != nil {
		return nil, fmt.Errorf("subscriptions: probe the checkpoints of %d stores: %w", len(stores), err)
	}
	defer rows.Close()
	positions, paused, err := ckprobe.Scan(len(stores), names, keys, rows.Next, rows.Scan)
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("subscriptions: probe the checkpoints of %d stores: %w", len(stores), err)
	}
	return probesOf(positions, paused), nil
}

// probeTables returns the store's tables as another store's probe names
// them: WithSchema's, bare on SQLite, and on Postgres without WithSchema
// those of the schema the pool's search_path selects, resolved once (on
// this store's pool) and kept.
func (g *GormCheckpointStore) probeTables(ctx context.Context) (gormTables, error) {
	if g.schema != "" || !g.dialect.RowLocks {
		return g.sql.gormTables, nil
	}
	if t := g.resolved.Load(); t != nil {
		return *t, nil
	}
	var schemas []string
	if err := g.db.WithContext(ctx).Raw(checkpointsSchemaQuery).Scan(&schemas).Error; err != nil {
		return gormTables{}, fmt.Errorf("resolve the checkpoint table's schema: %w", err)
	}
	if len(schemas) == 0 || schemas[0] == "" {
		return gormTables{}, errors.New("resolve the checkpoint table's schema: the search_path has no subscriber_checkpoints table")
	}
	t := tablesIn(schemas[0])
	g.resolved.Store(&t)
	return t, nil
}

// resolvedTables is a GormCheckpointStore's probeTables once resolved.
type resolvedTables = atomic.Pointer[gormTables]

// checkpointsSchemaQuery returns the schema of the subscriber_checkpoints
// table the connection's search_path selects (no row when none).
const checkpointsSchemaQuery = `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE c.oid = to_regclass('subscriber_checkpoints')`

// probesOf is ckprobe.Scan's answer as ProbeCheckpoints returns it.
func probesOf(positions [][]int64, paused [][]bool) [][]CheckpointProbe {
	out := make([][]CheckpointProbe, len(positions))
	for i := range positions {
		out[i] = make([]CheckpointProbe, len(positions[i]))
		for j := range positions[i] {
			out[i][j] = CheckpointProbe{Position: positions[i][j], Paused: paused[i][j]}
		}
	}
	return out
}

func emptyProbes(n, names int) [][]CheckpointProbe {
	out := make([][]CheckpointProbe, n)
	for i := range out {
		out[i] = make([]CheckpointProbe, names)
	}
	return out
}

func pauseKeys(names []string) []string {
	keys := make([]string, len(names))
	for i, name := range names {
		keys[i] = PauseKey(name)
	}
	return keys
}
