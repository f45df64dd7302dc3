package pgevents

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// TestIsNotifyFailure: a full notification queue, at the NOTIFY or at the
// commit, is a notify failure (the append runs again without it); other
// errors are not, whatever their text.
func TestIsNotifyFailure(t *testing.T) {
	full := &pgconn.PgError{Code: "54000", Message: "too many notifications in the NOTIFY queue"}
	require.True(t, IsNotifyFailure(fmt.Errorf("commit: %w", full)))
	require.True(t, IsNotifyFailure(NotifyError{errors.New("boom")}))
	require.True(t, IsNotifyFailure(fmt.Errorf("append: %w", NotifyError{errors.New("boom")})))
	require.False(t, IsNotifyFailure(nil))
	require.False(t, IsNotifyFailure(&pgconn.PgError{Code: "54000", Message: "statement too complex"}))
	require.False(t, IsNotifyFailure(&pgconn.PgError{Code: "54000", Message: "stack depth limit exceeded"}))
	require.False(t, IsNotifyFailure(&pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}))
	require.False(t, IsNotifyFailure(errors.New("too many notifications in the NOTIFY queue")))
}

// TestInsertError maps unique violations to the domain's errors.
func TestInsertError(t *testing.T) {
	id := InsertError("a", &pgconn.PgError{Code: "23505", ConstraintName: "events_pkey", Detail: "Key (id)=(x) already exists."})
	require.ErrorIs(t, id, domain.ErrInvalidEvent)
	require.ErrorContains(t, id, "Key (id)=(x)")
	seq := InsertError("a", &pgconn.PgError{Code: "23505", ConstraintName: "events_aggregate_sequence_key", Detail: "Key (aggregate_id, sequence_no)=(a, 1) already exists."})
	require.ErrorIs(t, seq, domain.ErrConcurrencyConflict)
	pos := InsertError("a", &pgconn.PgError{Code: "23505", ConstraintName: "events_position_key"})
	require.ErrorIs(t, pos, domain.ErrConcurrencyConflict)
	other := InsertError("a", &pgconn.PgError{Code: "23502"})
	require.False(t, errors.Is(other, domain.ErrConcurrencyConflict) || errors.Is(other, domain.ErrInvalidEvent))
}

// TestRequiredVersion: the version an append needs, from its expected
// version and explicit sequence numbers.
func TestRequiredVersion(t *testing.T) {
	req := func(expected int, seqs ...int) *appendRequest {
		r := &appendRequest{expectedVersion: expected}
		for _, s := range seqs {
			r.events = append(r.events, domain.EventEnvelope[any]{SequenceNo: s})
		}
		return r
	}
	for _, c := range []struct {
		r    *appendRequest
		want int
		ok   bool
	}{
		{req(-1, 0, 0), -1, true},
		{req(3, 0, 0), 3, true},
		{req(-1, 4, 5), 3, true},
		{req(3, 4, 0), 3, true},
		{req(2, 4), 0, false},
		{req(-1, 4, 6), 0, false},
		{req(-1, 0, 1), 0, false},
	} {
		got, ok := requiredVersion(c.r)
		require.Equal(t, c.ok, ok, "%+v", c.r)
		if ok {
			require.Equal(t, c.want, got)
		}
	}
}
