package pgevents_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// TestPostgresAppendNotifiesOncePerTransaction: the NOTIFY that rides in
// the INSERT's statement is sent once per append transaction that stored
// a row, however many appends and events it carries, and never by one
// that stored nothing (a version conflict) or that runs without it (the
// retry after a full queue); each append keeps its own outcome, and the
// positions follow one another.
func TestPostgresAppendNotifiesOncePerTransaction(t *testing.T) {
	ctx := feedtest.Context(t)
	pg := migratedPostgres(t)
	const channel = "pgevents_notify_once"
	listener := pgConnect(t, pg.DSN)
	_, err := listener.Exec(ctx, "LISTEN "+channel)
	require.NoError(t, err)
	marker := pgConnect(t, pg.DSN)
	conn := pgConnect(t, pg.DSN)
	// notified counts the append transactions' notifications committed
	// before a marker sent now: the queue delivers in commit order.
	notified := func(step string) int {
		_, err := marker.Exec(ctx, "SELECT pg_notify($1, $2)", channel, step)
		require.NoError(t, err)
		n := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			note, err := listener.WaitForNotification(wctx)
			cancel()
			require.NoError(t, err, "%s: the marker arrives", step)
			if note.Payload == step {
				return n
			}
			require.Empty(t, note.Payload, step)
			n++
		}
	}
	events := func(agg string, n int) []domain.EventEnvelope[any] {
		out := make([]domain.EventEnvelope[any], n)
		for i := range out {
			out[i] = feedtest.NewEvent(agg, "x", map[string]any{"i": i})
		}
		return out
	}
	run := func(notify bool, appends ...pgevents.TestAppend) []error {
		errs, err := pgevents.RunAppendTransaction(ctx, conn, channel, notify, appends...)
		require.NoError(t, err)
		return errs
	}
	one := func(agg string, expected, n int) pgevents.TestAppend {
		return pgevents.TestAppend{AggregateID: agg, ExpectedVersion: expected, Events: events(agg, n)}
	}

	for _, err := range run(true, one("lone", 0, 1)) {
		require.NoError(t, err)
	}
	require.Equal(t, 1, notified("lone single event"))

	for _, err := range run(true, one("several", 0, 3)) {
		require.NoError(t, err)
	}
	require.Equal(t, 1, notified("lone append of three events"))

	for _, err := range run(true, one("m1", 0, 1), one("m2", 0, 2), one("m3", 0, 1)) {
		require.NoError(t, err)
	}
	require.Equal(t, 1, notified("three appends in one transaction"))

	errs := run(true, one("lone", 0, 1))
	require.ErrorIs(t, errs[0], domain.ErrConcurrencyConflict)
	require.Equal(t, 0, notified("a lone conflict stores nothing"))

	errs = run(true, one("m4", 0, 1), one("m1", 0, 1), one("m5", 0, 1))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], domain.ErrConcurrencyConflict)
	require.ErrorContains(t, errs[1], "is at version 1")
	require.NoError(t, errs[2])
	require.Equal(t, 1, notified("a conflict among appends that commit"))

	errs = run(true, one("m1", 0, 1), one("m2", 0, 1))
	require.ErrorIs(t, errs[0], domain.ErrConcurrencyConflict)
	require.ErrorIs(t, errs[1], domain.ErrConcurrencyConflict)
	require.Equal(t, 0, notified("every append of the transaction conflicts"))

	for _, err := range run(false, one("quiet", 0, 1), one("quiet2", 0, 2)) {
		require.NoError(t, err)
	}
	require.Equal(t, 0, notified("without the NOTIFY"))

	// Every stored event in one run of positions, each aggregate's
	// sequence numbers from 1.
	rows, err := conn.Query(ctx, "SELECT aggregate_id, sequence_no, position FROM events ORDER BY position")
	require.NoError(t, err)
	var got []string
	var last int64
	for rows.Next() {
		var agg string
		var seq, pos int64
		require.NoError(t, rows.Scan(&agg, &seq, &pos))
		require.Equal(t, last+1, pos)
		last = pos
		got = append(got, fmt.Sprintf("%s/%d", agg, seq))
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"lone/1", "several/1", "several/2", "several/3", "m1/1", "m2/1", "m2/2", "m3/1", "m4/1", "m5/1", "quiet/1", "quiet2/1", "quiet2/2"}, got)
}

// TestPostgresMergedAppendPlannedOnce: a transaction of several appends,
// or of one append of several events, runs its INSERT on the statement's
// cached generic plan (Postgres would
// plan it again on every execution, under the append lock), and the
// session's own plan_cache_mode is back after every commit.
func TestPostgresMergedAppendPlannedOnce(t *testing.T) {
	ctx := feedtest.Context(t)
	pg := migratedPostgres(t)
	conn := pgConnect(t, pg.DSN)
	for i := range 8 {
		var appends []pgevents.TestAppend
		for j := range 3 {
			agg := fmt.Sprintf("planned-%d-%d", i, j)
			appends = append(appends, pgevents.TestAppend{AggregateID: agg, Events: []domain.EventEnvelope[any]{feedtest.NewEvent(agg, "x", nil)}, ExpectedVersion: 0})
		}
		errs, err := pgevents.RunAppendTransaction(ctx, conn, "pgevents_planned", true, appends...)
		require.NoError(t, err)
		for _, err := range errs {
			require.NoError(t, err)
		}
		agg := fmt.Sprintf("planned-%d-many", i)
		many := pgevents.TestAppend{AggregateID: agg, ExpectedVersion: 0}
		for j := range 3 {
			many.Events = append(many.Events, feedtest.NewEvent(agg, "x", j))
		}
		errs, err = pgevents.RunAppendTransaction(ctx, conn, "pgevents_planned", true, many)
		require.NoError(t, err)
		require.NoError(t, errs[0])
		var mode string
		require.NoError(t, conn.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode))
		require.Equal(t, "auto", mode, "the session's setting, after the commit")
	}
	var generic, custom int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE 'WITH written AS%' AND statement LIKE '%array_agg(aggregate_id)%'`).Scan(&generic, &custom))
	require.Equal(t, int64(8), generic)
	require.Zero(t, custom)
	require.NoError(t, conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE 'WITH written AS%' AND statement LIKE '%unnest($3::text[]%'`).Scan(&generic, &custom))
	require.Equal(t, int64(8), generic, "one append of several events")
	require.Zero(t, custom)
}
