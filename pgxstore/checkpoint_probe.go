package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

var _ subscriptions.CheckpointProber = (*CheckpointStore)(nil)

// ProbeCheckpoints reads the checkpoint and pause rows of names in every
// one of stores in one statement on this store's pool:
// subscriptions.Group's probe of its idle tenants on one database, which
// notices a reset, pause or resume made elsewhere within a poll interval
// (subscriptions.CheckpointProber). stores must be CheckpointStores of
// this package on this store's database: each store's tables are named
// in its own schema (WithSchema's, else the schema of the events table
// its constructor resolved through its pool's search_path, which the
// migrations create beside the checkpoint tables) and read through this
// store's connection; a store of another database whose schema this one
// lacks fails the statement. Any other store is an error wrapping
// errors.ErrUnsupported. Safe for concurrent use; it changes nothing.
func (s *CheckpointStore) ProbeCheckpoints(ctx context.Context, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
	tables := make([]schema.ProbeTables, len(stores))
	for i, store := range stores {
		other, ok := store.(*CheckpointStore)
		if !ok || other == nil {
			return nil, fmt.Errorf("pgxstore: probe checkpoints: store %d (%T) is not a pgxstore.CheckpointStore: %w", i, store, errors.ErrUnsupported)
		}
		t, ok := other.probeTables()
		if !ok {
			return nil, fmt.Errorf("pgxstore: probe checkpoints: store %d: its schema is not known (no events table beside its checkpoints): %w", i, errors.ErrUnsupported)
		}
		tables[i] = t
	}
	out := make([][]subscriptions.CheckpointProbe, len(stores))
	if len(stores) == 0 || len(names) == 0 {
		for i := range out {
			out[i] = make([]subscriptions.CheckpointProbe, len(names))
		}
		return out, nil
	}
	keys := make([]string, len(names))
	for i, name := range names {
		keys[i] = subscriptions.PauseKey(name)
	}
	rows, err := s.pool.Query(ctx, schema.CheckpointProbeQuery(tables, "(SELECT unnest($1::text[]))", "(SELECT unnest($2::text[]))"), names, keys)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: probe the checkpoints of %d stores: %w", len(stores), err)
	}
	defer rows.Close()
	positions, paused, err := schema.ScanCheckpointProbe(len(stores), names, keys, rows.Next, rows.Scan)
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("pgxstore: probe the checkpoints of %d stores: %w", len(stores), err)
	}
	for i := range out {
		out[i] = make([]subscriptions.CheckpointProbe, len(names))
		for j := range names {
			out[i][j] = subscriptions.CheckpointProbe{Position: positions[i][j], Paused: paused[i][j]}
		}
	}
	return out, nil
}

// probeTables names the store's checkpoint and pause tables for another
// store's probe: in WithSchema's schema, else in that of the events table
// the constructor resolved (eventsTable, "schema".events); ok is false
// when it resolved none.
func (s *CheckpointStore) probeTables() (schema.ProbeTables, bool) {
	if s.schema != "" {
		return schema.ProbeTables{Checkpoints: schema.Qualified(s.schema, "subscriber_checkpoints"), Pauses: schema.Qualified(s.schema, "subscriber_pauses")}, true
	}
	prefix, ok := strings.CutSuffix(s.eventsTable, ".events")
	if !ok || prefix == "" {
		return schema.ProbeTables{}, false
	}
	return schema.ProbeTables{Checkpoints: prefix + ".subscriber_checkpoints", Pauses: prefix + ".subscriber_pauses"}, true
}
