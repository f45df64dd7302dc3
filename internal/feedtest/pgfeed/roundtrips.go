package pgfeed

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/wirecount"
)

// OpenCounted opens a store of one backend on dsn, on a pool of one
// connection of its own (closed at cleanup) whose round trips and
// statements wire counts (wirecount.Counter.Dial, and the counter as the
// connections' pgx tracer).
type OpenCounted func(t testing.TB, dsn string, wire *wirecount.Counter) domain.EventStore

// RequireLoneAppendRoundTrips checks on the wire what a lone append
// costs, its connection warm and its statements prepared: one round trip
// of two statements (the append lock, then the checked INSERT with the
// NOTIFY in one statement, in the implicit transaction the pipeline's
// Sync commits), one event or
// several. On sessions that default to SERIALIZABLE, where a transaction
// sent without BEGIN would not run at READ COMMITTED, the appends are
// stored all the same, each in one round trip of four statements (BEGIN
// ISOLATION LEVEL READ COMMITTED ... COMMIT) once the first found out.
func RequireLoneAppendRoundTrips(t *testing.T, open OpenCounted) {
	ctx := feedtest.Context(t)
	pg := dbtest.NewPostgres(t)
	appendN := func(s domain.EventStore, agg string, n int) error {
		events := make([]domain.EventEnvelope[any], n)
		for i := range events {
			events[i] = feedtest.NewEvent(agg, "x", i)
		}
		return s.Append(ctx, agg, 0, events...)
	}
	for _, c := range []struct {
		name       string
		dsn        string
		stmts      int64
		statements string
	}{
		{"read committed by default", pg.DSN, 2, "the lock, the checked INSERT with the NOTIFY"},
		{"serializable by default", WithDefaultIsolation(t, pg.DSN, "serializable"), 4, "BEGIN, the lock, the checked INSERT with the NOTIFY, COMMIT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wire := &wirecount.Counter{}
			s := open(t, c.dsn, wire)
			for _, n := range []int{1, 3} { // warm: both INSERTs prepared
				require.NoError(t, appendN(s, fmt.Sprintf("%s-warm-%d", c.name, n), n))
			}
			for _, n := range []int{1, 3} {
				agg := fmt.Sprintf("%s-%d", c.name, n)
				turns, stmts, err := wire.Count(func() error { return appendN(s, agg, n) })
				require.NoError(t, err)
				require.Equal(t, int64(1), turns, "%d event(s): one round trip", n)
				require.Equal(t, c.stmts, stmts, "%d event(s): %s", n, c.statements)
				version, err := s.GetCurrentVersion(ctx, agg)
				require.NoError(t, err)
				require.Equal(t, n, version)
			}
			version, err := s.GetCurrentVersion(ctx, c.name+"-warm-1")
			require.NoError(t, err)
			require.Equal(t, 1, version, "the first append, which found the level out, is stored")
		})
	}
}
