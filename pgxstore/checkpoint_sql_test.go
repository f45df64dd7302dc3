package pgxstore

import (
	"io/fs"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/migrations/schema"
)

// moduleTables are the tables the Postgres migrations create, but the
// migrator's own.
func moduleTables(t *testing.T) []string {
	t.Helper()
	files, err := fs.Glob(schema.FS, "postgres/*.up.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	create := regexp.MustCompile(`(?i)CREATE TABLE IF NOT EXISTS (\w+)`)
	var tables []string
	for _, f := range files {
		text, err := fs.ReadFile(schema.FS, f)
		require.NoError(t, err)
		for _, m := range create.FindAllStringSubmatch(string(text), -1) {
			if m[1] != "subscriptions_schema_migrations" {
				tables = append(tables, m[1])
			}
		}
	}
	require.Contains(t, tables, "parked_events")
	return tables
}

// statements returns the string fields of a struct of rendered statements.
func statements(rendered any) map[string]string {
	v := reflect.ValueOf(rendered)
	out := map[string]string{}
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.String {
			out[v.Type().Field(i).Name] = f.String()
		}
	}
	return out
}

// TestStatementsNameTheirSchema: every statement a CheckpointStore or a
// ParkingLot renders names each of the module's tables it uses in the
// store's schema (a table's bare name only as the refname of its
// columns, "subscriber_attempts.holder", which Postgres gives the
// qualified table too), and a search_path store's name them bare, with
// no schema at all.
func TestStatementsNameTheirSchema(t *testing.T) {
	const name = `Tenant "7"`
	qualifier := schema.QuoteIdent(name) + "."
	tables := moduleTables(t)
	// A table's name where it is not the refname of a column, nor a part
	// of a longer name, nor after a qualifier.
	bare := regexp.MustCompile(`(^|[^\w."])(` + strings.Join(tables, "|") + `)\b([^.]|$)`)
	for kind, render := range map[string]func(string) any{
		"checkpoint": func(s string) any { return newCheckpointSQL(s) },
		"parking":    func(s string) any { return newParkingSQL(s) },
	} {
		qualified, plain := statements(render(name)), statements(render(""))
		require.NotEmpty(t, qualified)
		for field, text := range qualified {
			require.NotEmpty(t, text, "%s %s", kind, field)
			require.Contains(t, text, qualifier, "%s %s names no table in the schema", kind, field)
			if m := bare.FindStringSubmatch(text); m != nil {
				t.Errorf("%s %s names table %s without its schema: %s", kind, field, m[2], text)
			}
			require.Equal(t, plain[field], strings.ReplaceAll(text, qualifier, ""),
				"%s %s: the search_path store's text is the same statement, unqualified", kind, field)
		}
	}
}
