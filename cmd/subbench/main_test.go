package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestRunQuick runs the whole program in -quick mode against the test
// server: every scenario must produce rows with finite figures, replicas
// must never duplicate work, and every schema the run created must be gone
// afterwards, and the run must stay within its share of the server's
// connections (connectionBudget). Only correctness is checked here, never
// speed: figures taken on a shared CI machine (and under -race) say
// nothing.
func TestRunQuick(t *testing.T) {
	dbtest.RequirePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute) // a hang, not a speed limit: quick mode takes about a minute on a quiet machine
	defer cancel()

	peaks := sampleConnections(ctx, t)
	var progress bytes.Buffer
	rep, err := run(ctx, config{DSN: dbtest.PostgresDSN(), Quick: true}, &progress)
	peak := peaks()
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}

	perScenario := map[string]int{}
	for _, r := range rep.Rows {
		perScenario[r.Scenario]++
		if r.Figure != r.Figure || r.Baseline != r.Baseline { // NaN
			t.Errorf("%s / %s: figure %v, baseline %v", r.Scenario, r.Case, r.Figure, r.Baseline)
		}
		if r.Duplicates != nil && *r.Duplicates != 0 {
			t.Errorf("%s / %s: %d duplicates, want 0", r.Scenario, r.Case, *r.Duplicates)
		}
	}
	for _, s := range scenarios {
		if perScenario[s.num+" "+s.title] == 0 {
			t.Errorf("scenario %s (%s) produced no row", s.num, s.title)
		}
	}
	dups := 0
	for _, r := range rep.Rows {
		if r.Duplicates != nil {
			dups++
		}
	}
	if dups == 0 {
		t.Error("no row reports duplicates")
	}

	var table bytes.Buffer
	printTable(&table, rep)
	if !strings.Contains(table.String(), "RATIO") {
		t.Errorf("table has no header:\n%s", table.String())
	}

	// Nothing of the run is left on the server.
	conn, err := pgx.Connect(ctx, dbtest.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left int
	prefix := strings.SplitN(strings.TrimPrefix(rep.Notes[0], "Postgres "), "run ", 2)
	if len(prefix) != 2 {
		t.Fatalf("no run ID in the notes: %q", rep.Notes)
	}
	if err := conn.QueryRow(ctx, "SELECT COUNT(*) FROM pg_namespace WHERE starts_with(nspname, $1)", prefix[1]).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d schemas of run %s are left behind", left, prefix[1])
	}
	if n := peak[prefix[1]]; n == 0 || n > connectionBudget {
		t.Errorf("run %s held at most %d connections at once, want 1..%d (the server's max_connections is shared with everything else running)", prefix[1], n, connectionBudget)
	} else {
		t.Logf("run %s held at most %d connections at once", prefix[1], n)
	}
}

// connectionBudget is the most sessions a subbench run may hold at once:
// its pools are closed after each scenario (and each case of the scenarios
// that open many), and the server's max_connections (100 on the test
// machine) is shared with the other packages' tests running beside it.
const connectionBudget = 40

// sampleConnections counts, every 10 ms until the returned func is called,
// the server's sessions of each subbench run (application_name
// subbench_<hex> or subbench_<hex>_<app>), and returns the peak per run
// (subbench_<hex>).
func sampleConnections(ctx context.Context, t *testing.T) func() map[string]int {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbtest.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	peak := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			rows, err := conn.Query(sctx, `SELECT substring(application_name FROM '^subbench_[0-9a-f]+'), COUNT(*)
				FROM pg_stat_activity WHERE application_name ~ '^subbench_[0-9a-f]+' GROUP BY 1`)
			if err == nil {
				for rows.Next() {
					var run string
					var n int
					if rows.Scan(&run, &n) == nil {
						peak[run] = max(peak[run], n)
					}
				}
				rows.Close()
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() map[string]int {
		cancel()
		<-done
		return peak
	}
}

func TestParseOnly(t *testing.T) {
	sel, err := parseOnly("catchup, 4,idle")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"memory", "postgres", "sqlite", "latency", "idle"} {
		if !sel[k] {
			t.Errorf("%s not selected: %v", k, sel)
		}
	}
	if sel["appends"] || sel["replicas"] {
		t.Errorf("too much selected: %v", sel)
	}
	if _, err := parseOnly("nope"); err == nil {
		t.Error("unknown scenario accepted")
	}
	if sel, err := parseOnly(""); err != nil || sel != nil {
		t.Errorf("empty -only: %v, %v", sel, err)
	}
}

// TestUndecidedGoal: a goal the rounds' noise cannot decide is printed as
// such, never as met, and the spread that decides it is (max-min)/median.
func TestUndecidedGoal(t *testing.T) {
	if got := roundSpread([]float64{90, 100, 110}); got < 0.199 || got > 0.201 {
		t.Fatalf("spread %v, want 0.2", got)
	}
	if got := roundSpread([]float64{100, 101, 102}); got > 0.05 {
		t.Fatalf("spread %v, want 0.02", got)
	}
	r := newRow("case", 110, 100, "ev/s", "base").goal(">= 0.95", true).undecided(">= 0.95", "not resolved at this noise")
	if r.Met != nil {
		t.Fatalf("an undecided goal has no yes/no")
	}
	var out bytes.Buffer
	printTable(&out, &Report{Rows: []Row{r}})
	if s := out.String(); !strings.Contains(s, "not resolved at this noise") || strings.Contains(s, "yes") {
		t.Fatalf("table:\n%s", s)
	}
}
