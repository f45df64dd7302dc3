package pgxstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// testCtx is a context that ends with the test, bounded so that a hang
// fails instead of waiting for the binary's timeout.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newDatabase returns a fresh schema (skipped or failed without Postgres,
// per SUBSCRIPTIONS_REQUIRE_POSTGRES) and a pgx pool on it.
func newDatabase(t testing.TB) (*dbtest.Postgres, *pgxpool.Pool) {
	t.Helper()
	pg := dbtest.NewPostgres(t)
	return pg, pg.OpenPgx(t)
}
