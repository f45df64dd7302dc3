package main

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// runExample runs the program in-process, as `go run ./examples/projection
// args...` would.
func runExample(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	code = run(ctx, args, &out, &errs)
	return code, out.String(), errs.String()
}

// section returns the lines of out from the first line starting with
// title up to (excluding) the next line that does not start with a space.
func section(t *testing.T, out, title string) string {
	t.Helper()
	i := strings.Index(out, "\n"+title)
	require.GreaterOrEqualf(t, i, 0, "no %q section in:\n%s", title, out)
	lines := strings.Split(out[i+1:], "\n")
	end := 1
	for end < len(lines) && strings.HasPrefix(lines[end], " ") {
		end++
	}
	return strings.Join(lines[:end], "\n")
}

// requireBalance checks one row of a balances table.
func requireBalance(t *testing.T, table, account, owner string, balance, events int) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(account) + `\s+` + owner + `\s+` + strconv.Itoa(balance) + `\s+` + strconv.Itoa(events) + `\s*$`)
	require.Regexpf(t, re, table, "want %s (%s) at %d after %d events", account, owner, balance, events)
}

// requireScenario checks everything the example prints, whatever the
// backend: the projection before and after the replay, the parked event,
// the lag and the exactly-once check.
func requireScenario(t *testing.T, code int, out, errs string, replicas int) {
	t.Helper()
	require.Equalf(t, 0, code, "exit code; stdout:\n%s\nstderr:\n%s", out, errs)

	require.Contains(t, out, "subscribers: "+strconv.Itoa(replicas)+` running as "balances"`)
	require.Regexp(t, `(?m)^progress: \d+/11 events processed, \d parked, lag \d+$`, out)
	require.Contains(t, out, "progress: 11/11 events processed, 1 parked, lag 0\n")

	before := section(t, out, "parked events (before replay):")
	require.Regexp(t, `position 8  account\.withdrawn  event \S+  attempts 3\n    error: withdrawal of 60 would overdraw acc-2 \(balance 40\): overdrafts not supported`, before)

	table := section(t, out, "balances (before replay")
	requireBalance(t, table, "acc-1", "Alice", 120, 4)
	requireBalance(t, table, "acc-2", "Bob", 140, 3) // the withdrawal is parked
	requireBalance(t, table, "acc-3", "Carol", 375, 3)

	require.Contains(t, out, "replayed: position 8 (account.withdrawn)\n")
	require.Contains(t, out, "parked events (after replay): none\n")
	table = section(t, out, "balances (after replay)")
	requireBalance(t, table, "acc-1", "Alice", 120, 4)
	requireBalance(t, table, "acc-2", "Bob", 80, 4)
	requireBalance(t, table, "acc-3", "Carol", 375, 3)

	require.Contains(t, out, "\nlag: 0\n")
	require.Contains(t, out, "\nhandled once: yes (each of the 11 events committed exactly once)\n")
	require.Regexp(t, `(?m)^summary: (sqlite|postgres), `+strconv.Itoa(replicas)+` replica\(s\), 11 events appended and projected, 1 parked and replayed, lag 0, handled once: yes, \d+\.\ds$`, out)

	// Every replica is listed and the committed events add up to 11.
	m := regexp.MustCompile(`(?m)^events committed per replica: (.*)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	parts := strings.Split(m[1], ", ")
	require.Len(t, parts, replicas)
	total := 0
	for i, p := range parts {
		prefix := "#" + strconv.Itoa(i+1) + ": "
		require.True(t, strings.HasPrefix(p, prefix), p)
		n, err := strconv.Atoi(strings.TrimPrefix(p, prefix))
		require.NoError(t, err)
		total += n
	}
	require.Equal(t, 11, total)

	// The blue/green rebuild: the new version catches up, the view is
	// switched, the old name retired, and the readers never saw a partial
	// table; the 3 events appended meanwhile are in the new projection.
	require.Contains(t, out, `"balances/v2" caught up to position 13 (WaitCaughtUp)`+"\n")
	require.Contains(t, out, `switched: balances_live now reads balances_v2 (SwitchOver: "balances" paused, "balances/v2" past it, one transaction)`+"\n")
	require.Contains(t, out, `retired "balances": stopped, checkpoint and parked events deleted (DeleteState), table dropped`+"\n")
	table = section(t, out, "balances (after the blue/green rebuild")
	requireBalance(t, table, "acc-1", "Alice", 125, 5)
	requireBalance(t, table, "acc-2", "Bob", 80, 4)
	requireBalance(t, table, "acc-3", "Carol", 405, 5)
	require.Regexp(t, `(?m)^readers: [1-9]\d* reads of balances_live during the rebuild and the switch, 0 saw a partial table$`, out)

	// The library's logs of the failing event go to stderr.
	require.Contains(t, errs, "event parked after exhausting its retries")
}

// requireSQLiteRemoved checks that the temporary directory is gone.
func requireSQLiteRemoved(t *testing.T, out string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^database: SQLite file (\S+) \(removed at exit\)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	_, err := os.Stat(m[1])
	require.Truef(t, os.IsNotExist(err), "%s still exists (err %v)", m[1], err)
}

// requireSchemaDropped checks that the example's schema is gone.
func requireSchemaDropped(t *testing.T, out string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^database: Postgres .* schema (subscriptions_example_[0-9a-f]+) \(dropped at exit\)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	db := dbtest.OpenPostgresDSN(t, dbtest.PostgresDSN())
	var n int64
	require.NoError(t, db.Raw("SELECT count(*) FROM pg_namespace WHERE nspname = ?", m[1]).Scan(&n).Error)
	require.Zero(t, n, "schema %s still exists", m[1])
}

func TestSQLite(t *testing.T) {
	code, out, errs := runExample(t)
	requireScenario(t, code, out, errs, 1)
	requireSQLiteRemoved(t, out)
}

func TestSQLiteReplicas(t *testing.T) {
	code, out, errs := runExample(t, "-replicas", "3")
	requireScenario(t, code, out, errs, 3)
	requireSQLiteRemoved(t, out)
}

func TestPostgres(t *testing.T) {
	dbtest.RequirePostgres(t)
	code, out, errs := runExample(t, "-postgres", dbtest.PostgresDSN())
	requireScenario(t, code, out, errs, 1)
	requireSchemaDropped(t, out)
}

func TestPostgresReplicas(t *testing.T) {
	dbtest.RequirePostgres(t)
	code, out, errs := runExample(t, "-postgres", dbtest.PostgresDSN(), "-replicas", "3")
	requireScenario(t, code, out, errs, 3)
	requireSchemaDropped(t, out)
}

// TestBadDSN: a DSN that does not parse or a server that does not answer
// is a clear message and exit status 1, and the password never appears.
func TestBadDSN(t *testing.T) {
	const password = "hunter2-Secret"
	silent := silentServer(t)
	for _, tc := range []struct {
		name, dsn, want string
	}{
		{"refused", "postgres://demo:" + password + "@127.0.0.1:1/test?sslmode=disable", "projection: cannot connect to Postgres at 127.0.0.1:1"},
		{"refused keyword/value", "host=127.0.0.1 port=1 user=demo password='" + password + "' dbname=test sslmode=disable", "projection: cannot connect to Postgres at 127.0.0.1:1"},
		{"server never answers", "postgres://demo:" + password + "@" + silent + "/test?sslmode=disable", "projection: cannot connect to Postgres at " + silent},
		{"bad port", "postgres://demo:" + password + "@127.0.0.1:notaport/test", "projection: invalid -postgres DSN: "},
		{"unescaped @ in password", "postgres://demo:" + strings.Replace(password, "-", "@", 1) + "@127.0.0.1:5432/test", "projection: invalid -postgres DSN: its host contains '@'"},
		{"not a DSN", "no such thing", "projection: invalid -postgres DSN: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, out, errs := runExample(t, "-postgres", tc.dsn, "-connect-timeout", "500ms")
			require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", out, errs)
			require.Contains(t, errs, tc.want)
			require.Less(t, time.Since(start), 10*time.Second, "the connect timeout was not honoured")
			for _, secret := range []string{"hunter2", "Secret"} {
				require.NotContains(t, out, secret)
				require.NotContains(t, errs, secret)
			}
		})
	}
}

// silentServer accepts TCP connections and never says a word, like a
// firewall that swallows packets: only a connect timeout gets past it.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-replicas", "0"}, 2, "-replicas 0: must be between 1 and 16"},
		{[]string{"-replicas", "17"}, 2, "-replicas 17: must be between 1 and 16"},
		{[]string{"-connect-timeout", "0s"}, 2, "-connect-timeout 0s: must be positive"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-nosuchflag"}, 2, "flag provided but not defined: -nosuchflag"},
		{[]string{"-h"}, 0, "usage: projection [-postgres DSN] [-replicas N]"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := runExample(t, tc.args...)
			require.Equal(t, tc.code, code, "stderr:\n%s", errs)
			require.Contains(t, errs, tc.want)
			require.Empty(t, out)
		})
	}
}

// TestREADMEQuickStart keeps the README's quick start identical to
// Example_projection in the module root's example_test.go, which `go test`
// compiles and runs.
func TestREADMEQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	const marker = "<!-- quick-start: Example_projection in example_test.go -->\n```go\n"
	i := bytes.Index(readme, []byte(marker))
	require.GreaterOrEqual(t, i, 0, "README.md has no quick-start marker %q", marker)
	snippet := readme[i+len(marker):]
	end := bytes.Index(snippet, []byte("\n```\n"))
	require.GreaterOrEqual(t, end, 0, "unterminated quick-start block")
	snippet = snippet[:end+1]

	const path = "../../example_test.go"
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	require.NoError(t, err)
	var body []byte
	for _, decl := range file.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "Example_projection" {
			start := fset.Position(fn.Pos()).Offset
			// Through the closing brace and the newline after it.
			body = src[start : fset.Position(fn.End()).Offset+1]
		}
	}
	require.NotNil(t, body, "no Example_projection in %s", path)
	require.Equal(t, string(body), string(snippet), "README.md's quick start differs from Example_projection in example_test.go: copy the function over")
}
