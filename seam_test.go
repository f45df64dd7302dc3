package subscriptions_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// backendFile matches the root files that belong to a backend: the GORM
// stores (Postgres and SQLite), the memory stores and Postgres' own
// pieces. Every other root file is the core (the run loop, partitions,
// retries, telemetry, status), which reaches the stores through the
// exported interfaces only.
var backendFile = regexp.MustCompile(`(_gorm|gorm_|_memory|_postgres)`)

// coreForbiddenImports are the packages only a backend may import: the
// drivers, GORM, database/sql, and the module's SQL helpers.
var coreForbiddenImports = []string{
	"gorm.io/", "github.com/jackc/", "database/sql",
	"github.com/eventfeed/subscriptions/internal/dialect",
	"github.com/eventfeed/subscriptions/internal/sqlerr",
	"github.com/eventfeed/subscriptions/internal/eventrow",
	"github.com/eventfeed/subscriptions/infrastructure/pgevents",
	"github.com/eventfeed/subscriptions/internal/pgxconn",
	"github.com/eventfeed/subscriptions/internal/sqliteconf",
	"net/http", "html/template",
}

// coreForbiddenNames are the backends' concrete types.
var coreForbiddenNames = map[string]bool{
	"gormBatch": true, "GormCheckpointStore": true, "GormParkingLot": true,
	"MemoryCheckpointStore": true, "MemoryParkingLot": true, "memoryBatch": true,
	"pinnedTx": true, "handlerConn": true,
}

// TestCoreKnowsNoBackend: no core file of the root package (see
// backendFile) imports a driver, GORM or an SQL helper, or names a
// backend's concrete type; the core reaches its stores through
// CheckpointStore, Batch, ParkingLot and their optional capabilities, so
// that a backend outside this package gets every guarantee (see
// subscriptionstest). The root package as a whole imports no net/http:
// the operator surfaces live in package admin.
func TestCoreKnowsNoBackend(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var core int
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			if path == "net/http" || path == "html/template" {
				t.Errorf("%s imports %s: the operator surfaces belong in package admin", name, path)
			}
			if backendFile.MatchString(name) {
				continue
			}
			for _, bad := range coreForbiddenImports {
				if strings.HasPrefix(path, bad) {
					t.Errorf("%s imports %s: a core file reaches its stores through the exported interfaces only", name, path)
				}
			}
		}
		if backendFile.MatchString(name) {
			continue
		}
		core++
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && coreForbiddenNames[id.Name] {
				t.Errorf("%s: %s names the backend type %s", name, fset.Position(id.Pos()), id.Name)
			}
			return true
		})
	}
	require.Greater(t, core, 10, "the core files were found")
}
