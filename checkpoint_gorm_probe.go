package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/eventfeed/subscriptions/migrations/schema"
)

var _ CheckpointProber = (*GormCheckpointStore)(nil)

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
	tables := make([]schema.ProbeTables, len(stores))
	for i, store := range stores {
		other, ok := store.(*GormCheckpointStore)
		if !ok || other == nil || other.dialect != g.dialect || (!g.dialect.RowLocks && other.pool != g.pool) {
			return nil, fmt.Errorf("subscriptions: probe checkpoints: store %d (%T) is not a GormCheckpointStore on this store's database: %w", i, store, errors.ErrUnsupported)
		}
		t, err := other.probeTables(ctx)
		if err != nil {
			return nil, fmt.Errorf("subscriptions: probe checkpoints: store %d: %w", i, err)
		}
		tables[i] = schema.ProbeTables{Checkpoints: t.checkpoints, Pauses: t.pauses}
	}
	if len(stores) == 0 || len(names) == 0 {
		return emptyProbes(len(stores), len(names)), nil
	}
	keys := pauseKeys(names)
	// GORM binds every name and key of every store, 2 x stores x names
	// parameters: a statement reads as many stores as keep it within the
	// drivers' limits (probeParams), the next ones in another.
	per := max(1, probeParams/(2*len(names)))
	var positions [][]int64
	var paused [][]bool
	for from := 0; from < len(tables); from += per {
		part := tables[from:min(from+per, len(tables))]
		args := make([]any, 0, 2*len(part))
		for range part {
			args = append(args, names, keys)
		}
		pos, pau, err := g.probeStatement(ctx, part, names, keys, args)
		if err != nil {
			return nil, fmt.Errorf("subscriptions: probe the checkpoints of %d stores: %w", len(stores), err)
		}
		positions, paused = append(positions, pos...), append(paused, pau...)
	}
	return probesOf(positions, paused), nil
}

// probeParams bounds the parameters of one probe statement: SQLite's
// default limit is 32,766, Postgres's 65,535.
const probeParams = 32000

// probeStatement runs the checkpoint probe of tables in one statement.
func (g *GormCheckpointStore) probeStatement(ctx context.Context, tables []schema.ProbeTables, names, keys []string, args []any) ([][]int64, [][]bool, error) {
	rows, err := g.db.WithContext(ctx).Raw(schema.CheckpointProbeQuery(tables, "?", "?"), args...).Rows()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	positions, paused, err := schema.ScanCheckpointProbe(len(tables), names, keys, rows.Next, rows.Scan)
	if err == nil {
		err = rows.Err()
	}
	return positions, paused, err
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
	if strings.Contains(schemas[0], "?") {
		// GORM takes every ? of the statement for a placeholder, as
		// WithSchema refuses such a name for.
		return gormTables{}, fmt.Errorf("the search_path's schema %q contains \"?\", which GORM reads as a placeholder: %w", schemas[0], errors.ErrUnsupported)
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

// probesOf is schema.ScanCheckpointProbe's answer as ProbeCheckpoints returns it.
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
