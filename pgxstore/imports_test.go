package pgxstore_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsOnlyTheExportedSeam: the package's non-test code imports the
// standard library, pgx v5, and of this module only its exported root
// package, domain, migrations/schema and infrastructure/pgevents (the
// GORM-free engine of the Postgres event store, whose own test keeps its
// import graph free of GORM): no GORM, no infrastructure, no internal
// package, so that it is a backend any other team could write.
func TestImportsOnlyTheExportedSeam(t *testing.T) {
	t.Parallel()
	const module = "github.com/eventfeed/subscriptions"
	allowed := map[string]bool{module: true, module + "/domain": true, module + "/migrations/schema": true,
		module + "/infrastructure/pgevents": true}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			first, _, _ := strings.Cut(path, "/")
			switch {
			case !strings.Contains(first, "."): // the standard library
			case path == "github.com/jackc/pgx/v5" || strings.HasPrefix(path, "github.com/jackc/pgx/v5/"):
			case allowed[path]:
			default:
				t.Errorf("%s imports %q, outside the package's allowed imports", name, path)
			}
		}
		checked++
	}
	require.NotZero(t, checked)
}
