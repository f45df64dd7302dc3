package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	migschema "github.com/eventfeed/subscriptions/migrations/schema"
)

// tenantSchema creates the schema name on the test server for the test
// (dropped at cleanup) and returns a pool on it (nil for an empty schema
// the test leaves without tables: with tables false).
func tenantSchema(t *testing.T, name string, tables bool) *gorm.DB {
	t.Helper()
	admin := dbtest.OpenPostgresDSN(t, dbtest.PostgresDSN())
	require.NoError(t, admin.Exec("CREATE SCHEMA "+migschema.QuoteIdent(name)).Error)
	t.Cleanup(func() { dbtest.DropSchema(t, name) })
	if !tables {
		return nil
	}
	dsn, err := dbtest.WithSearchPath(dbtest.PostgresDSN(), migschema.QuoteIdent(name))
	require.NoError(t, err)
	return dbtest.OpenPostgresDSN(t, dsn)
}

// tenantState fills a tenant's schema: events, of which those of type
// "order.bad" are parked, handled by each of names (run until caught up,
// then stopped). It returns the parked events' IDs.
func tenantState(t *testing.T, db *gorm.DB, types []string, names ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	parking, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)
	var bad []string
	for i, typ := range types {
		env := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("order-%d", i), typ, 0)
		require.NoError(t, events.Append(ctx, env.AggregateID, 0, env))
		if typ == "order.bad" {
			bad = append(bad, env.ID)
		}
	}
	for _, name := range names {
		sub, err := subscriptions.NewSubscriber(name, events, checkpoints, func(_ context.Context, ev domain.EventEnvelope[any]) error {
			if ev.EventType == "order.bad" {
				return errors.New("cannot handle a bad order")
			}
			return nil
		}, subscriptions.WithParkingLot(parking), subscriptions.WithMaxRetries(0),
			subscriptions.WithPollInterval(20*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- sub.Run(runCtx) }()
		require.Eventually(t, func() bool {
			st, err := sub.Status(ctx)
			return err == nil && st.Lag == 0 && st.Parked == len(bad)
		}, time.Minute, 20*time.Millisecond, "%s did not catch up", name)
		stop()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("Run did not return")
		}
	}
	return bad
}

// TestTenantSchemas: tenants as schemas of one Postgres database. -schemas
// runs status, parked list and show, and migrate -verify over every
// matching schema that has the checkpoint table (not one without), with a
// TENANT column and a tenant in JSON; -tenant picks one, and is what every
// write needs: a write over a pattern is refused, even one that matches a
// single schema, and changes nothing; a pattern matching nothing, a
// tenant without the table, a malformed pattern and a SQLite DSN are
// refused. A pause, reset and discard with -tenant change that tenant's
// subscriber only, and their audit lines name the tenant. A schema name
// with a capital letter is addressed exactly (quoted).
func TestTenantSchemas(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	dbtest.RequirePostgres(t)
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	prefix := "clitn_" + hex.EncodeToString(b)
	ta, tb, tc, empty := prefix+"_a", prefix+"_B", prefix+"_c", prefix+"_empty"
	badA := tenantState(t, tenantSchema(t, ta, true), []string{"order.placed", "order.bad", "order.placed"}, "orders")
	dbB := tenantSchema(t, tb, true)
	tenantState(t, dbB, []string{"order.placed", "order.placed"}, "orders", "emails")
	tenantState(t, tenantSchema(t, tc, true), []string{"order.placed"}, "orders")
	tenantSchema(t, empty, false)
	all := prefix + "_*"
	run := func(stdin string, args ...string) result {
		return runCLI(t, cli, stdin, nil, append([]string{"-dsn", dbtest.PostgresDSN()}, args...)...)
	}
	row := func(tenant, rest string) string { return `(?m)^` + regexp.QuoteMeta(tenant) + `\s+` + rest }

	// Reads over every tenant.
	r := run("", "status", "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^TENANT\s+SUBSCRIBER\s+POSITION\s+HEAD\s+LAG\s+LAG_TIME\s+PARKED\s+PARTITIONS\s+STATE$`, r.stdout)
	require.Regexp(t, row(ta, `orders\s+3\s+3\s+0\s+0s\s+1\s+-\s+caught up`), r.stdout)
	require.Regexp(t, row(tb, `orders\s+2\s+2\s+0\s+0s\s+0\s+-\s+caught up`), r.stdout)
	require.Regexp(t, row(tb, `emails\s+2\s+2\s+0\s+0s\s+0\s+-\s+caught up`), r.stdout)
	require.Regexp(t, row(tc, `orders\s+1\s+1\s+0\s+0s\s+0\s+-\s+caught up`), r.stdout)
	require.NotContains(t, r.stdout, empty, "a schema without the checkpoint table is no tenant")
	require.Len(t, regexp.MustCompile(`(?m)^`+prefix).FindAllString(r.stdout, -1), 4)

	r = run("", "-json", "status", "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	var st struct {
		Subscribers []struct {
			Tenant, Subscriber string
			Position           int64
		}
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	got := map[string]int64{}
	for _, s := range st.Subscribers {
		got[s.Tenant+"/"+s.Subscriber] = s.Position
	}
	require.Equal(t, map[string]int64{ta + "/orders": 3, tb + "/emails": 2, tb + "/orders": 2, tc + "/orders": 1}, got)

	// The filter: a narrower pattern, one tenant.
	r = run("", "status", "-schemas", prefix+"_[ac]")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, row(ta, `orders\s+3\s+`), r.stdout)
	require.Regexp(t, row(tc, `orders\s+1\s+`), r.stdout)
	require.NotContains(t, r.stdout, tb)
	r = run("", "status", "-tenant", tb)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, row(tb, `emails\s+2\s+`), r.stdout)
	require.NotContains(t, r.stdout, ta)

	r = run("", "parked", "list", "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^TENANT\s+SUBSCRIBER\s+POSITION\s+EVENT_ID\s+`, r.stdout)
	require.Regexp(t, row(ta, `orders\s+2\s+`+badA[0]+`\s+order\.bad\s+order-1\s+`), r.stdout)
	require.Len(t, regexp.MustCompile(`(?m)^`+prefix).FindAllString(r.stdout, -1), 1)
	r = run("", "parked", "list", "-tenant", tb)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no parked events\n", r.stdout)

	r = run("", "parked", "show", badA[0], "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^tenant\s+`+ta+`$`, r.stdout)
	require.Contains(t, r.stdout, "cannot handle a bad order")
	r = run("", "-json", "parked", "show", badA[0], "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"tenant": "`+ta+`"`)
	r = run("", "parked", "show", badA[0], "-tenant", tb)
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stderr, "is not parked for any subscriber")

	r = run("", "migrate", "-verify", "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("tenant %q: schema is current\n", tb))

	// Refusals: nothing matches, no such tenant, bad flags; writes over a
	// pattern.
	before := run("", "status", "-schemas", all).stdout
	for _, bad := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"status", "-schemas", prefix + "_nothing*"}, 1, "no schema of that name has a subscriber_checkpoints table"},
		{[]string{"parked", "list", "-schemas", "nomatch_" + prefix}, 1, "no schema of that name has a subscriber_checkpoints table"},
		{[]string{"status", "-tenant", empty}, 1, `tenant "` + empty + `": no schema of that name has a subscriber_checkpoints table`},
		{[]string{"status", "-tenant", prefix + "_b"}, 1, "no schema of that name"}, // exact: B is not b
		{[]string{"status", "-schemas", "["}, 2, "not a pattern"},
		{[]string{"status", "-schemas", prefix + "_a*", "-tenant", tc}, 2, "does not match -schemas"},
		{[]string{"-yes", "reset", "orders", "0", "-schemas", all}, 2, "reset changes a subscriber: name exactly one tenant with -tenant NAME"},
		{[]string{"-yes", "pause", "orders", "-schemas", ta}, 2, "pause changes a subscriber: name exactly one tenant"},
		{[]string{"-yes", "resume", "orders", "-schemas", all}, 2, "name exactly one tenant"},
		{[]string{"-yes", "repartition", "orders", "-partitions", "2", "-schemas", all}, 2, "name exactly one tenant"},
		{[]string{"-yes", "parked", "discard", badA[0], "-schemas", all}, 2, "name exactly one tenant"},
		{[]string{"migrate", "-schemas", all}, 2, "migrate changes a schema: name exactly one tenant"},
		{[]string{"-yes", "reset", "nobody", "0", "-tenant", ta}, 1, `tenant "` + ta + `": no subscriber "nobody"`},
		{[]string{"-dsn", filepath.Join(t.TempDir(), "x.db"), "status", "-schemas", all}, 2, "-schemas and -tenant take a Postgres DSN"},
	} {
		r := run("", bad.args...)
		require.Equal(t, bad.code, r.code, "%v: %s", bad.args, r.stderr)
		require.Contains(t, r.stderr, bad.msg, bad.args)
	}
	require.Equal(t, before, run("", "status", "-schemas", all).stdout, "no refused command changed anything")

	// Writes with -tenant act on that tenant only.
	r = run("n\n", "pause", "orders", "-tenant", tb)
	require.Equal(t, exitDeclined, r.code, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf(`Pause subscriber "orders" of tenant %q everywhere?`, tb))
	r = run("", "-yes", "pause", "orders", "-tenant", tb, "-reason", "tenant B moves")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, fmt.Sprintf(`^paused: subscriber "orders" of tenant %q everywhere since \S+Z: tenant B moves\n$`, tb), r.stdout)
	require.Regexp(t, `subscriber paused.* by=cli:\S+ tenant=`+tb+` `, r.stderr, "the audit line names the tenant")
	r = run("", "status", "-schemas", all)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, row(tb, `orders\s+2\s+2\s+0\s+0s\s+0\s+-\s+paused, caught up`), r.stdout)
	require.Regexp(t, row(ta, `orders\s+3\s+3\s+0\s+0s\s+1\s+-\s+caught up`), r.stdout, "a's orders is not paused")
	require.Contains(t, r.stdout, fmt.Sprintf("(`subscriptions resume -tenant %s orders` lifts it)", tb))
	r = run("", "-yes", "-json", "resume", "orders", "-tenant", tb)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"tenant": "`+tb+`"`)
	require.Contains(t, r.stdout, `"paused": false`)

	r = run("", "-yes", "-json", "reset", "orders", "1", "-tenant", ta)
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, fmt.Sprintf(`{"subscriber":"orders","from":3,"position":1,"tenant":%q}`, ta), r.stdout)
	require.Regexp(t, `subscriber checkpoint reset.* tenant=`+ta, r.stderr)
	r = run("", "status", "-schemas", all)
	require.Regexp(t, row(ta, `orders\s+1\s+3\s+2\s+`), r.stdout)
	require.Regexp(t, row(tc, `orders\s+1\s+1\s+0\s+`), r.stdout)
	require.Regexp(t, row(tb, `orders\s+2\s+2\s+0\s+`), r.stdout, "b's orders was not reset")

	r = run("y\n", "parked", "discard", badA[0], "-tenant", ta)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf(`of subscriber "orders" of tenant %q? It will never be processed.`, ta))
	require.Regexp(t, `parked event discarded.* tenant=`+ta, r.stderr)
	r = run("", "parked", "list", "-schemas", all)
	require.Equal(t, "no parked events\n", r.stdout)

	// migrate -tenant gives an empty schema the module's tables: it is a
	// tenant from then on.
	r = run("", "migrate", "-tenant", empty)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("tenant %q: schema migrated\n", empty), r.stdout)
	r = run("", "-json", "status", "-tenant", empty)
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"subscribers":[]}`, r.stdout)
	r = run("", "migrate", "-tenant", prefix+"_none")
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stderr, "no such schema in this database")

	// A tenant that cannot be read (only the original module's checkpoint
	// table): status shows the others and a row saying why, and fails.
	old := prefix + "_old"
	require.NoError(t, tenantSchema(t, old, true).Exec("CREATE TABLE subscriber_checkpoints (subscriber text NOT NULL PRIMARY KEY, position bigint NOT NULL, updated_at timestamptz)").Error)
	r = run("", "status", "-schemas", all)
	require.Equal(t, 1, r.code, r.stderr)
	require.Regexp(t, row(ta, `orders\s+1\s+3\s+2\s+`), r.stdout)
	require.Regexp(t, row(old, `-\s+0\s+0\s+0\s+0s\s+0\s+-\s+error: migrations: database schema is not the one`), r.stdout)
	require.Contains(t, r.stderr, "status: 1 of 5 tenants could not be read")
	require.Contains(t, r.stderr, fmt.Sprintf("tenant %q: ", old))
	require.Contains(t, r.stderr, "missing table events", "the reason, whole")
}
