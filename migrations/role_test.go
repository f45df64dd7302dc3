package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

// restrictedRole creates a login role that may read and write the tables
// of pg's schema but not create anything in it (no CREATE on the schema,
// not the owner of anything), as production applications run, and
// returns a pool connected as that role. The role is dropped at cleanup.
func restrictedRole(t *testing.T, pg *dbtest.Postgres) (db *gorm.DB, grant func()) {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	role := "app_" + hex.EncodeToString(b)
	admin := func(sql string) {
		t.Helper()
		require.NoError(t, pg.DB.Exec(sql).Error, sql)
	}
	ident := pgx.Identifier{role}.Sanitize()
	schema := pgx.Identifier{pg.Schema}.Sanitize()
	admin("CREATE ROLE " + ident + " LOGIN")
	t.Cleanup(func() {
		// After the schema's pools are closed (cleanups run in reverse).
		_ = pg.DB.Exec("DROP OWNED BY " + ident).Error
		_ = pg.DB.Exec("DROP ROLE " + ident).Error
	})
	admin("REVOKE CREATE ON SCHEMA " + schema + " FROM PUBLIC")
	admin("GRANT USAGE ON SCHEMA " + schema + " TO " + ident)

	u, err := url.Parse(pg.DSN)
	require.NoError(t, err)
	u.User = url.User(role)
	db = dbtest.OpenPostgresDSN(t, u.String())
	var canCreate bool
	require.NoError(t, db.Raw("SELECT has_schema_privilege(current_user, current_schema(), 'CREATE')").Scan(&canCreate).Error)
	require.False(t, canCreate, "the role must not be able to create tables")
	return db, func() {
		admin("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + schema + " TO " + ident)
	}
}

// TestVerifyOnlyUnderRoleWithoutCreate: an application role without CREATE
// rights. Before the migrations are applied, the verify-only constructors
// fail with one error naming each missing table and the file that adds
// it (and the ordinary constructors fail on the DDL they may not run).
// Once an administrator has applied the files with goose, every
// constructor starts without DDL, and a subscriber with a parking lot
// processes, parks and replays events under that role.
func TestVerifyOnlyUnderRoleWithoutCreate(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	db, grant := restrictedRole(t, pg)

	_, err := infrastructure.NewGormEventStore(db, infrastructure.WithSchemaVerifyOnly())
	require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
	require.ErrorContains(t, err, "infrastructure: NewGormEventStore: migrations: database schema is not the one this module needs: missing table subscriptions_schema_migrations (added by postgres/00001_create_tables.up.sql); missing table events (added by postgres/00001_create_tables.up.sql)")
	_, err = subscriptions.NewGormCheckpointStore(db, subscriptions.WithSchemaVerifyOnly())
	require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
	require.ErrorContains(t, err, "missing table subscriber_checkpoints (added by postgres/00001_create_tables.up.sql)")
	_, err = subscriptions.NewGormParkingLot(db, subscriptions.WithSchemaVerifyOnly())
	require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
	require.ErrorContains(t, err, "missing table parked_events (added by postgres/00001_create_tables.up.sql)")
	_, err = subscriptions.NewGormCheckpointStore(db)
	require.ErrorContains(t, err, "permission denied", "without the option the constructor tries the DDL")

	require.Equal(t, fileCount(t, "postgres"), dbtest.ApplyWithGoose(t, pg.DB), "the administrator applies the files")
	require.NoError(t, pg.DB.Exec("CREATE TABLE role_projection (event_id text PRIMARY KEY, position bigint NOT NULL)").Error)
	grant()

	events, err := infrastructure.NewGormEventStore(db, infrastructure.WithSchemaVerifyOnly())
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db, subscriptions.WithSchemaVerifyOnly())
	require.NoError(t, err)
	lot, err := subscriptions.NewGormParkingLot(db, subscriptions.WithSchemaVerifyOnly())
	require.NoError(t, err)
	_, err = subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err, "an up-to-date schema: the ordinary constructor runs no DDL either")

	var ids []string
	for i := range 6 {
		ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, "role-agg", "role.test", 0)
		require.NoError(t, events.Append(ctx, ev.AggregateID, -1, ev))
		ids = append(ids, ev.ID)
	}
	poison := ids[3]
	healed := false
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		if ev.ID == poison && !healed {
			return errors.New("poison")
		}
		_, err := subscriptions.SQLTxFromContext(ctx).ExecContext(ctx, "INSERT INTO role_projection (event_id, position) VALUES ($1, $2)", ev.ID, ev.Position)
		return err
	}
	projected := func() []string {
		var out []string
		require.NoError(t, db.Raw("SELECT event_id FROM role_projection ORDER BY position").Scan(&out).Error)
		return out
	}
	sub, err := subscriptions.NewSubscriber("role", events, cps, handler, subscriptions.WithParkingLot(lot),
		subscriptions.WithMaxRetries(0), subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	require.Eventually(t, func() bool {
		lag, err := sub.Lag(ctx)
		return err == nil && lag == 0
	}, 30*time.Second, 5*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	require.Equal(t, append(append([]string{}, ids[:3]...), ids[4:]...), projected(), "every event but the poison one, once")
	parked, err := sub.ListParked(ctx)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, poison, parked[0].EventID)
	healed = true
	require.NoError(t, sub.ReplayParked(ctx, poison))
	require.ElementsMatch(t, ids, projected())
	parked, err = sub.ListParked(ctx)
	require.NoError(t, err)
	require.Empty(t, parked)
}
