package pgevents

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableStatements: on the bare events table the statements are the
// package's constants byte for byte (a search_path store's statement
// texts did not change), and in a schema every one names the table
// schema-qualified and quoted, none the bare table.
func TestTableStatements(t *testing.T) {
	bare := newTableSQL("events")
	require.Equal(t, SelectEvents, bare.selectEvents)
	require.Equal(t, SelectStored, bare.selectStored)

	table, err := NewTable(`Tenant "q"`, `"Tenant ""q""".events`)
	require.NoError(t, err)
	require.Equal(t, `"Tenant ""q""".events`, table.Name())
	q := table.sql
	for _, stmt := range []string{q.selectEvents, q.selectStored, q.selectHeads, q.checkedInsert, q.checkedInsertOne, q.mergedInsert, q.writeOne, q.writeMany, q.writeMerged} {
		require.Contains(t, stmt, `"Tenant ""q""".events`)
		require.NotContains(t, stmt, eventsMarker)
		require.NotContains(t, strings.ReplaceAll(stmt, table.Name(), ""), "events", "every mention of events is the qualified table")
	}
}

// TestNewTableRefuses a missing table and a schema name that cannot be
// named exactly, and keys the lock by the canonical name alone.
func TestNewTableRefuses(t *testing.T) {
	_, err := NewTable("tenant_x", "")
	require.ErrorContains(t, err, `no events table in schema "tenant_x"`)
	_, err = NewTable("", "")
	require.ErrorContains(t, err, "no events table on the search_path")
	_, err = NewTable(strings.Repeat("x", 64), "x.events")
	require.ErrorContains(t, err, "longer than")

	viaSearchPath, err := NewTable("", "tenant_x.events")
	require.NoError(t, err)
	viaSchema, err := NewTable("tenant_x", "tenant_x.events")
	require.NoError(t, err)
	other, err := NewTable("tenant_y", "tenant_y.events")
	require.NoError(t, err)
	require.Equal(t, viaSearchPath.LockKey(), viaSchema.LockKey(), "one table, one lock, however it is named")
	require.NotEqual(t, viaSchema.LockKey(), other.LockKey())
	require.Equal(t, AppendLockKey("tenant_x.events"), viaSchema.LockKey())
	require.NotEqual(t, viaSearchPath.Name(), viaSchema.Name())
}
