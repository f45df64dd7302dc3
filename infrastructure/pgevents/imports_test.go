package pgevents_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportGraphHasNoGorm: the package, and everything it depends on
// (its whole import graph, not only its own imports), is free of GORM and
// of package infrastructure (which imports GORM), so that pgxstore, a
// backend written on the module's exported API, may use it without
// pulling GORM in; and the package itself works on pgx connections, not
// database/sql ones (which pgx itself imports).
func TestImportGraphHasNoGorm(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	own, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").CombinedOutput()
	require.NoError(t, err, "%s", own)
	require.NotContains(t, strings.Fields(string(own)), "database/sql")
	require.Contains(t, deps, "github.com/eventfeed/subscriptions/infrastructure/pgevents")
	require.Contains(t, deps, "github.com/jackc/pgx/v5", "the list is the package's import graph")
	for _, dep := range deps {
		switch {
		case strings.HasPrefix(dep, "gorm.io/"), strings.Contains(dep, "/gorm"):
			t.Errorf("imports %s: GORM", dep)
		case dep == "github.com/eventfeed/subscriptions/infrastructure":
			t.Errorf("imports package infrastructure, which imports GORM")
		}
	}
}
