package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestMain removes the built binaries and then checks for leaked
// goroutines, as dbtest.VerifyTestMain does.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string
	buildOut  []byte
	buildErr  error
)

// binaries builds this command and examples/projection once per test run
// and returns their paths.
func binaries(t *testing.T) (cli, example string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "subscriptions-cli-test-")
		if buildErr != nil {
			return
		}
		// One go build for both: it compiles and links them side by side.
		buildOut, buildErr = exec.Command("go", "build", "-o", binDir+string(filepath.Separator), ".", "../../examples/projection").CombinedOutput()
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return filepath.Join(binDir, "subscriptions"), filepath.Join(binDir, "projection")
}

// liveExample runs examples/projection with -admin until the test ends and
// returns its "database:" line once it serves (the database then holds
// the example's subscriber, caught up, with one parked event).
func liveExample(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(args, "-admin", "127.0.0.1:0")...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		for range lines { // drain until the example exits
		}
		require.NoError(t, cmd.Wait(), "the example did not exit cleanly:\n%s", stderr.String())
	})
	var database string
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the example exited early:\n%s", stderr.String())
			if strings.HasPrefix(line, "database: ") {
				database = line
			}
			if strings.HasPrefix(line, "admin: http://") {
				return database
			}
		case <-deadline:
			t.Fatalf("the example did not serve within 2 minutes:\n%s", stderr.String())
		}
	}
}

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type result struct {
	code           int
	stdout, stderr string
}

// cli runs the built command with args, stdin and environment variables.
func runCLI(t *testing.T, bin, stdin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{code, out.String(), errs.String()}
}

// TestEndToEnd builds the binary and runs every command against a
// database that examples/projection filled and still runs on: SQLite and
// Postgres.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	cli, example := binaries(t)
	for _, c := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string {
			line := liveExample(t, example)
			m := regexp.MustCompile(`^database: SQLite file (\S+) `).FindStringSubmatch(line)
			require.NotNil(t, m, line)
			return m[1]
		}},
		{"postgres", func(t *testing.T) string {
			dbtest.RequirePostgres(t)
			line := liveExample(t, example, "-postgres", dbtest.PostgresDSN())
			m := regexp.MustCompile(`schema (subscriptions_example_[0-9a-f]+) `).FindStringSubmatch(line)
			require.NotNil(t, m, line)
			dsn, err := dbtest.WithSearchPath(dbtest.PostgresDSN(), m[1])
			require.NoError(t, err)
			return dsn
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dsn := c.dsn(t)
			run := func(stdin string, args ...string) result {
				return runCLI(t, cli, stdin, nil, append([]string{"-dsn", dsn}, args...)...)
			}

			r := run("", "status")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^SUBSCRIBER\s+POSITION\s+HEAD\s+LAG\s+LAG_TIME\s+PARKED\s+PARTITIONS\s+STATE$`, r.stdout)
			require.Regexp(t, `(?m)^balances\s+11\s+11\s+0\s+0s\s+1\s+-\s+caught up$`, r.stdout)

			// The example's constructors migrated the database: migrate
			// finds nothing to do, and -verify agrees.
			r = run("", "migrate", "-verify")
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, "schema is current\n", r.stdout)
			r = run("", "migrate")
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, "schema migrated\n", r.stdout)

			// The DSN from the environment, JSON for scripts.
			r = runCLI(t, cli, "", []string{"SUBSCRIPTIONS_DSN=" + dsn}, "status", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			var st struct {
				Subscribers []struct {
					Subscriber string
					Position   int64
					Parked     int
				}
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
			require.Len(t, st.Subscribers, 1)
			require.Equal(t, "balances", st.Subscribers[0].Subscriber)
			require.Equal(t, 1, st.Subscribers[0].Parked)

			r = run("", "parked", "list", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			var listed struct {
				Parked []struct {
					Subscriber string
					Page       struct {
						Events []struct {
							EventID     string `json:"event_id"`
							EventType   string `json:"event_type"`
							AggregateID string `json:"aggregate_id"`
							Position    int64
						}
					}
				}
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed), r.stdout)
			require.Len(t, listed.Parked, 1)
			require.Len(t, listed.Parked[0].Page.Events, 1)
			ev := listed.Parked[0].Page.Events[0]
			require.Equal(t, "account.withdrawn", ev.EventType)
			require.Equal(t, "acc-2", ev.AggregateID)
			require.Equal(t, int64(8), ev.Position)

			r = run("", "parked", "list", "-subscriber", "balances")
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `(?m)^balances\s+8\s+`+ev.EventID+`\s+account\.withdrawn\s+acc-2\s+3\s+\S+\s+dispatch event `, r.stdout)
			r = run("", "parked", "list", "-type", "account.deposited")
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, "no parked events\n", r.stdout)

			r = run("", "parked", "show", ev.EventID)
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, "account.withdrawn")
			require.Contains(t, r.stdout, `"Amount": 60`)
			require.Contains(t, r.stdout, "overdrafts not supported")

			r = run("", "parked", "replay", ev.EventID)
			require.Equal(t, 1, r.code)
			require.Contains(t, r.stderr, "admin.NewHandler")

			// Discard: declined, then confirmed.
			r = run("n\n", "parked", "discard", ev.EventID)
			require.Equal(t, 3, r.code, r.stderr)
			require.Contains(t, r.stderr, "Discard parked event "+ev.EventID)
			r = run("", "parked", "discard", ev.EventID)
			require.Equal(t, 3, r.code, "no answer is no: %s", r.stderr)
			r = run("y\n", "parked", "discard", ev.EventID)
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, "discarded: event "+ev.EventID)
			require.Contains(t, r.stderr, "parked event discarded", "the audit line")
			require.Contains(t, r.stderr, "by=cli:")
			r = run("", "parked", "discard", ev.EventID, "-yes")
			require.Equal(t, 1, r.code)
			require.Contains(t, r.stderr, "is not parked for any subscriber")

			// Reset: declined, then confirmed with -yes (the example's
			// subscriber, still running, processes the events again).
			r = run("no\n", "reset", "balances", "5")
			require.Equal(t, 3, r.code, r.stderr)
			require.Contains(t, r.stderr, `Reset subscriber "balances" from position 11 to 5?`)
			r = run("", "-yes", "reset", "balances", "5", "-json")
			require.Equal(t, 0, r.code, r.stderr)
			require.JSONEq(t, `{"subscriber":"balances","from":11,"position":5}`, r.stdout)
			require.Regexp(t, `subscriber checkpoint reset.* by=cli:\S+`, r.stderr, "the audit line names the operator")

			for _, bad := range []struct {
				args []string
				code int
				msg  string
			}{
				{[]string{"reset", "balances", "-3"}, 2, "want a whole number >= 0"},
				{[]string{"reset", "balances", "x"}, 2, "want a whole number >= 0"},
				{[]string{"reset", "nobody", "1", "-yes"}, 1, `no subscriber "nobody"`},
				{[]string{"reset", "balances", "12", "-yes"}, 1, "position 12 is beyond the feed head 11"},
				{[]string{"status", "extra"}, 2, "status: takes no arguments"},
				{[]string{"parked", "list", "-subscriber", "nobody"}, 1, `no subscriber "nobody"`},
				{[]string{"parked", "show"}, 2, "want exactly one EVENT_ID"},
				{[]string{"parked", "frob"}, 2, "unknown"},
				{[]string{"frob"}, 2, `unknown command "frob"`},
				{[]string{"status", "-nope"}, 2, "flag provided but not defined"},
			} {
				r = run("", bad.args...)
				require.Equal(t, bad.code, r.code, "%v: %s", bad.args, r.stderr)
				require.Contains(t, r.stderr, bad.msg, bad.args)
			}
		})
	}
}

// TestMigrateCommand: on a database without the module's tables,
// migrate -verify fails naming what is missing and changes nothing;
// migrate creates the schema, after which -verify passes.
func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	path := filepath.Join(t.TempDir(), "empty.db")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	run := func(args ...string) result {
		return runCLI(t, cli, "", nil, append([]string{"-dsn", path}, args...)...)
	}

	r := run("migrate", "-verify")
	require.Equal(t, 1, r.code, r.stdout)
	require.Contains(t, r.stderr, "missing table events (added by sqlite/00001_create_tables.up.sql)")
	r = run("migrate", "-verify")
	require.Equal(t, 1, r.code, "-verify created nothing")

	r = run("migrate")
	require.Equal(t, 0, r.code, r.stderr)
	r = run("migrate", "-verify")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "schema is current\n", r.stdout)
	r = run("migrate", "-verify", "-json")
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"schema":"current"}`, r.stdout)
	r = run("-json", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"subscribers":[]}`, r.stdout)
	r = run("-json", "parked", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"parked":[]}`, r.stdout)

	r = run("migrate", "extra")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "migrate: takes no arguments")
}

// TestErrorsWithoutADatabase: no DSN, a missing SQLite file, a database
// without the module's tables, and a server that refuses: each a clear
// message, a non-zero exit, and never the password.
func TestErrorsWithoutADatabase(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	const password = "Pa55-w0rd-never-shown"
	empty := filepath.Join(t.TempDir(), "empty.db")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	for _, c := range []struct {
		name string
		env  []string
		args []string
		code int
		msg  string
	}{
		{"no DSN", []string{"SUBSCRIPTIONS_DSN="}, []string{"status"}, 2, "pass -dsn DSN or set SUBSCRIPTIONS_DSN"},
		{"missing file", nil, []string{"-dsn", filepath.Join(t.TempDir(), "nope.db"), "status"}, 1, "no such file"},
		{"no tables", nil, []string{"-dsn", empty, "status"}, 1, "no subscriber_checkpoints table"},
		{"refused URL", nil, []string{"-dsn", "postgres://demo:" + password + "@127.0.0.1:1/test?sslmode=disable", "status"}, 1, "cannot connect to Postgres at 127.0.0.1:1"},
		{"refused key=value", nil, []string{"-dsn", "host=127.0.0.1 port=1 user=demo password='" + password + "' dbname=test", "status"}, 1, "cannot connect to Postgres at 127.0.0.1:1"},
		{"malformed URL", nil, []string{"-dsn", "postgres://demo:" + password + "@127.0.0.1:notaport/test", "status"}, 1, "invalid Postgres DSN"},
		{"help", nil, []string{"help"}, 0, ""},
	} {
		r := runCLI(t, cli, "", c.env, c.args...)
		require.Equal(t, c.code, r.code, "%s: %s", c.name, r.stderr)
		require.Contains(t, r.stderr, c.msg, c.name)
		require.NotContains(t, r.stdout+r.stderr, password, c.name)
		if c.code == 0 {
			require.Contains(t, r.stdout, "usage: subscriptions")
		}
	}
	{
		// The example's schema is gone once it exits; a database without the
		// tables is refused, not migrated.
		dbtest.RequirePostgres(t)
		pg := dbtest.NewPostgres(t)
		r := runCLI(t, cli, "", nil, "-dsn", pg.DSN, "status")
		require.Equal(t, 1, r.code, r.stderr)
		require.Contains(t, r.stderr, "no subscriber_checkpoints table")
	}
}

// TestHelpIsDocumented: docs/operations.md shows the help this command
// prints, word for word.
func TestHelpIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	require.Contains(t, string(doc), "```\n"+usage+"```\n", "copy the output of `go run ./cmd/subscriptions help` into docs/operations.md")
}

// TestStaticBinaryReadsSQLite builds the command with CGO_ENABLED=0 (a
// static binary, as operators ship it) and checks that it still opens a
// SQLite file, through the pure-Go driver (sqlite_purego.go).
func TestStaticBinaryReadsSQLite(t *testing.T) {
	t.Parallel()
	static := filepath.Join(t.TempDir(), "subscriptions-static")
	build := exec.Command("go", "build", "-o", static, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	// The static build runs while binaries builds the example (it is
	// waited for below, or at cleanup if binaries fails the test).
	type built struct {
		out []byte
		err error
	}
	done := make(chan built, 1)
	go func() {
		out, err := build.CombinedOutput()
		done <- built{out, err}
	}()
	var b built
	waited := false
	t.Cleanup(func() {
		if !waited {
			<-done
		}
	})
	_, example := binaries(t)
	b, waited = <-done, true
	require.NoError(t, b.err, "CGO_ENABLED=0 go build: %s", b.out)

	line := liveExample(t, example)
	m := regexp.MustCompile(`^database: SQLite file (\S+) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	r := runCLI(t, static, "", nil, "-dsn", m[1], "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^balances\s+11\s+11\s+0\s+0s\s+1\s+-\s+caught up$`, r.stdout)
}
