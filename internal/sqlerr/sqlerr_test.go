package sqlerr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/sqlerr"
)

// TestSQLiteCode: a real constraint violation from each driver is
// classified by its result code, wrapped or not; text that merely says
// "constraint failed" is not.
func TestSQLiteCode(t *testing.T) {
	for _, d := range []dbtest.SQLiteDriver{dbtest.Mattn, dbtest.Glebarez} {
		t.Run(d.Name, func(t *testing.T) {
			db := d.OpenDSN(t, d.FileDSN(t.TempDir()+"/code.db"))
			require.NoError(t, db.Exec("CREATE TABLE t (id text PRIMARY KEY)").Error)
			require.NoError(t, db.Exec("INSERT INTO t (id) VALUES ('a')").Error)
			err := db.Exec("INSERT INTO t (id) VALUES ('a')").Error
			require.Error(t, err)
			code, primary, ok := sqlerr.SQLiteCode(err)
			require.True(t, ok, "%T %v", err, err)
			require.Equal(t, sqlerr.SQLiteConstraint, primary)
			require.Equal(t, 1555, code, "SQLITE_CONSTRAINT_PRIMARYKEY")
			require.True(t, sqlerr.SQLiteConstraintViolation(fmt.Errorf("handler: %w", err)))

			err = db.Exec("SELECT * FROM no_such_table").Error
			require.Error(t, err)
			_, primary, ok = sqlerr.SQLiteCode(err)
			require.True(t, ok)
			require.Equal(t, 1, primary, "SQLITE_ERROR")
			require.False(t, sqlerr.SQLiteConstraintViolation(err))
		})
	}
	require.False(t, sqlerr.SQLiteConstraintViolation(errors.New("UNIQUE constraint failed: t.id")), "text is not a code")
	require.False(t, sqlerr.SQLiteConstraintViolation(nil))
	require.False(t, sqlerr.SQLiteConstraintViolation(gorm.ErrDuplicatedKey))
}

func TestSQLState(t *testing.T) {
	require.Equal(t, "", sqlerr.SQLState(errors.New("23505")))
	require.Equal(t, "25P02", sqlerr.SQLState(fmt.Errorf("x: %w", &pgconn.PgError{Code: "25P02"})))
	require.Equal(t, "23503", sqlerr.SQLState(errors.Join(errors.New("a"), &pgconn.PgError{Code: "23503"})))
	require.True(t, sqlerr.CommitRolledBack(fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)))
	require.False(t, sqlerr.CommitRolledBack(errors.New("commit unexpectedly resulted in rollback")))
}

// TestUniqueViolation: a unique violation from each engine, and from a
// translating GORM, names what was violated; other errors are not one.
func TestUniqueViolation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		want   sqlerr.Unique
		unique bool
	}{
		{"postgres", fmt.Errorf("insert: %w", &pgconn.PgError{Code: "23505", ConstraintName: "events_pkey", Detail: "Key (id)=(a) already exists."}),
			sqlerr.Unique{Constraint: "events_pkey", Detail: "Key (id)=(a) already exists."}, true},
		{"postgres other error", &pgconn.PgError{Code: "23503", ConstraintName: "fk"}, sqlerr.Unique{}, false},
		{"sqlite mattn", errors.New("UNIQUE constraint failed: events.id"), sqlerr.Unique{Constraint: "events.id"}, true},
		{"sqlite modernc", errors.New("constraint failed: UNIQUE constraint failed: events.aggregate_id, events.sequence_no (2067)"),
			sqlerr.Unique{Constraint: "events.aggregate_id, events.sequence_no"}, true},
		{"sqlite primary key", errors.New("PRIMARY KEY constraint failed: t.id"), sqlerr.Unique{Constraint: "t.id"}, true},
		{"translated", fmt.Errorf("insert: %w", gorm.ErrDuplicatedKey), sqlerr.Unique{}, true},
		{"other", errors.New("database is locked"), sqlerr.Unique{}, false},
		{"nil", nil, sqlerr.Unique{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, unique := sqlerr.UniqueViolation(tc.err)
			require.Equal(t, tc.unique, unique)
			require.Equal(t, tc.want, got)
		})
	}
}
