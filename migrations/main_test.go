package migrations_test

import (
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
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
	return len(fileVersions(t, dialect))
}

// fileVersions are the versions of a dialect's migration files, in order,
// read from FS as a migration tool reads them.
func fileVersions(t *testing.T, dialect string) []int64 {
	t.Helper()
	entries, err := fs.ReadDir(migrations.FS, dialect)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, e := range entries {
		prefix, _, _ := strings.Cut(e.Name(), "_")
		v, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}
