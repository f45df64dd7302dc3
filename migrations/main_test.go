package migrations_test

import (
	"log/slog"
	"testing"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fileCount is the number of migration files of a dialect: what goose
// applies to a database that has none of them recorded.
func fileCount(t *testing.T, dialect string) int {
	t.Helper()
	versions, _, _, err := migrations.FilesForTest(dialect)
	if err != nil {
		t.Fatal(err)
	}
	return len(versions)
}
