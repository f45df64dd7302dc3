package subscriptions

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestEventCaused: where a commit failure came from decides whether an
// event is blamed; text never does.
func TestEventCaused(t *testing.T) {
	gorm := &Subscriber{classifier: &GormCheckpointStore{}}
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"COMMIT: deferred foreign key", pg("23503"), true},
		{"COMMIT: serialization failure", pg("40001"), false},
		{"COMMIT: connection lost", fmt.Errorf("commit: %w", driver.ErrBadConn), false},
		{"COMMIT turned into a rollback (pgx)", fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback), true},
		{"COMMIT turned into a rollback (pipeline)", fmt.Errorf("commit: %w", errTxRolledBack), true},
		{"COMMIT: text that says constraint failed", errors.New("handler: UNIQUE constraint failed: x"), false},
		{"handlers: misuse", staged(stageHandlers, fmt.Errorf("refused: %w", sql.ErrTxDone)), true},
		{"handlers: whole SQLite transaction rolled back", staged(stageHandlers, errTxEndedByStatement), true},
		{"library: undefined table", staged(stageLibrary, pg("42P01")), false},
		{"library: permission denied", staged(stageLibrary, pg("42501")), false},
		{"library: read-only transaction", staged(stageLibrary, pg("25006")), false},
		{"library: bad data", staged(stageLibrary, pg("22001")), false},
		{"library: transaction aborted by a handler", staged(stageLibrary, pg("25P02")), true},
		{"library: idle-in-transaction timeout", staged(stageLibrary, pg("25P03")), true},
		{"library: text that says constraint failed", staged(stageLibrary, errors.New("constraint failed")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, gorm.eventCaused(tc.err))
		})
	}
	require.True(t, gorm.failedEarlier(pg("25P02")))
	require.False(t, gorm.failedEarlier(pg("23505")))
	// A store that cannot classify blames only what the loop sees.
	plain := &Subscriber{}
	require.True(t, plain.eventCaused(staged(stageHandlers, errors.New("misuse"))))
	require.True(t, plain.eventCaused(fmt.Errorf("commit: %w", errTxEndedByStatement)))
	require.False(t, plain.eventCaused(pg("23503")))
	require.False(t, plain.failedEarlier(pg("25P02")))
}
