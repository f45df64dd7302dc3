package dialect

import (
	"testing"

	"github.com/glebarez/sqlite"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// TestOf: each supported engine maps to its dialect by gorm.DB.Name().
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		dialector gorm.Dialector
		want      *Dialect
	}{
		{postgres.New(postgres.Config{DSN: "postgres://unused"}), Postgres},
		{sqlite.Open(":memory:"), SQLite},
	} {
		db := &gorm.DB{Config: &gorm.Config{Dialector: tc.dialector}}
		require.Same(t, tc.want, Of(db), tc.dialector.Name())
	}
}

// TestParkedKeys: the Postgres digests are SHA-256 of the subscriber name
// (and of name NUL event ID), hex-encoded, as the migrations' trigger
// computes them; SQLite selects by the plain columns.
func TestParkedKeys(t *testing.T) {
	where, args := Postgres.ParkedKey("s", "e")
	require.Equal(t, "key = decode(?, 'hex') AND subscriber = ? AND event_id = ?", where)
	require.Equal(t, []any{"8fb42ad727ccd568f91b8798b0c305c733390747124ddbe80ad90249fc957756", "s", "e"}, args)
	require.Equal(t, "043a718774c572bd8a25adbeb1bfcd5c0256ae11cecf9f9c3f925d0e52beaf89", digest("s"))
	where, args = SQLite.ParkedSubscriber("s")
	require.Equal(t, "subscriber = ?", where)
	require.Equal(t, []any{"s"}, args)
	q, qargs := SQLite.ParkUpsert("parked_events", ParkedRow{Subscriber: "s", EventID: "e"})
	require.Contains(t, q, "ON CONFLICT (subscriber, event_id)")
	require.Len(t, qargs, 8)
	q, qargs = Postgres.ParkUpsert("parked_events", ParkedRow{Subscriber: "s", EventID: "e"})
	require.Contains(t, q, "ON CONFLICT (key)")
	require.Len(t, qargs, 10)
}

// TestServerQueries: only Postgres has server-side cancellation, an
// isolation level to check and an SQL partition hash; on SQLite the
// callers take their in-process paths ("" everywhere).
func TestServerQueries(t *testing.T) {
	require.Equal(t, "SELECT pg_backend_pid()", Postgres.BackendPID())
	require.Equal(t, "SELECT pg_cancel_backend(?)", Postgres.CancelBackend())
	show, readCommitted := Postgres.ShowIsolation()
	require.Equal(t, "SHOW transaction_isolation", show)
	require.Equal(t, "read committed", readCommitted)
	require.Equal(t, MD5PartitionHash, Postgres.PartitionHash())

	require.Empty(t, SQLite.BackendPID())
	require.Empty(t, SQLite.CancelBackend())
	show, readCommitted = SQLite.ShowIsolation()
	require.Empty(t, show)
	require.Empty(t, readCommitted)
	require.Empty(t, SQLite.PartitionHash())
	require.Nil(t, SQLite.TxOptions(), "ShowIsolation is empty exactly where the module chooses no level")
}
