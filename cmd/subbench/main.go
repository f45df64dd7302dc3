// Command subbench measures the subscriptions library side by side with the
// plain baseline that bounds each figure, in one run, and prints a table
// (or, with -json, JSON) of every figure, its baseline and their ratio
// (figure / baseline).
//
// It needs only a Postgres server: it creates fresh schemas of its own
// (subbench_<run>_<scenario>), and drops them at the end, on error and on
// interrupt too. The SQLite scenario uses a file in a temporary directory,
// also removed at the end.
//
//	go -C cmd/subbench run .                       # every scenario, ~6-7 minutes
//	go -C cmd/subbench run . -quick                # smoke mode, seconds
//	go -C cmd/subbench run . -only latency,idle    # selected scenarios
//	go -C cmd/subbench run . -json -cpuprofile cpu.out
//
// It is a module of its own (as examples/prometheus and watermill are),
// so that what it measures the library against stays out of the
// library's dependencies: from the repository's root, go -C runs it (or
// cd cmd/subbench first); its tests run there too (go test ./...).
//
// Scenarios: memory (1), postgres (2), sqlite (3), latency (4),
// replicas (5), idle (6), appends (7), telemetry (8), partitions (9),
// batch (10), ordered (11), operations (12), peer (13: watermill-sql, see
// peer.go), feedread (14), tenants (15: a Group over 500 schemas, see
// tenants.go); "catchup" selects 1-3. Scenarios 2, 4, 6 and 7 measure both
// Postgres backends in the same run, the GORM one and package pgxstore's:
// pgx's rows are labelled "pgx:", with the scenario's baseline (a
// hand-written one goes through pgx's own store or transactions), and
// "pgx vs GORM" rows where the two race or alternate.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/eventfeed/subscriptions/internal/dsn"
)

// config is everything the flags decide.
type config struct {
	DSN     string
	Quick   bool
	Only    map[string]bool // nil: every scenario
	Verbose bool            // library warnings and errors to stderr
}

// Row is one figure of the report.
type Row struct {
	Scenario string  `json:"scenario"`
	Case     string  `json:"case"`
	Figure   float64 `json:"figure"`
	Baseline float64 `json:"baseline"`
	Unit     string  `json:"unit"`
	// Ratio is Figure / Baseline; nil when the baseline is 0.
	Ratio *float64 `json:"ratio"`
	// BaselineName says what the baseline is.
	BaselineName string `json:"baseline_name,omitempty"`
	Goal         string `json:"goal,omitempty"`
	// Met is whether the goal was met; nil without a goal, or when the
	// run could not tell (Verdict says why).
	Met *bool `json:"met,omitempty"`
	// Verdict, when set, replaces yes/no: the goal was neither shown met
	// nor missed (e.g. the rounds' noise exceeds the margin the goal asks).
	Verdict    string `json:"verdict,omitempty"`
	Duplicates *int64 `json:"duplicates,omitempty"`
	Note       string `json:"note,omitempty"`
}

// Report is the whole run: the machine, then the rows.
type Report struct {
	Started   time.Time         `json:"started"`
	Duration  string            `json:"duration"`
	Mode      string            `json:"mode"`
	GoVersion string            `json:"go_version"`
	CPUs      int               `json:"cpus"`
	Postgres  string            `json:"postgres"`
	Loads     map[string]string `json:"load_average"` // per scenario: "before -> after"
	Rows      []Row             `json:"rows"`
	Notes     []string          `json:"notes,omitempty"`
}

// scenario is one group of measurements.
type scenario struct {
	key   string // for -only
	num   string
	title string
	run   func(ctx context.Context, b *bench) ([]Row, error)
}

var scenarios = []scenario{
	{"memory", "1", "catch-up, memory", runCatchupMemory},
	{"postgres", "2", "catch-up, Postgres projection", runCatchupPostgres},
	{"sqlite", "3", "catch-up, SQLite file projection", runCatchupSQLite},
	{"latency", "4", "wake latency, Postgres", runLatency},
	{"replicas", "5", "replicas, Postgres", runReplicas},
	{"idle", "6", "idle cost, Postgres", runIdle},
	{"appends", "7", "appends, Postgres", runAppends},
	{"telemetry", "8", "OpenTelemetry SDK installed vs not", runTelemetry},
	{"partitions", "9", "partitions, Postgres", runPartitions},
	{"batch", "10", "batch handler rebuild, Postgres", runBatchHandler},
	{"ordered", "11", "ordered parking, Postgres", runOrdered},
	{"operations", "12", "re-deliveries, repartition, pause, Postgres", runOperations},
	{"peer", "13", "peer: watermill-sql beside the library, Postgres", runPeer},
	{"feedread", "14", "feed read, Postgres: no-op catch-up vs a raw reader", runFeedRead},
	{"tenants", "15", "tenants: a Group over 500 schemas vs a Subscriber each, Postgres", runTenants},
}

func main() {
	if conf, ok := os.LookupEnv(appendChildEnv); ok {
		// A child process of scenario 7's multi-process variant.
		if err := runAppendChild(conf); err != nil {
			fmt.Fprintln(os.Stderr, "subbench child:", err)
			os.Exit(1)
		}
		return
	}
	var (
		cfg        config
		only       string
		asJSON     bool
		cpuprofile string
		timeout    time.Duration
	)
	defaultDSN := os.Getenv(dsn.PostgresEnv)
	if defaultDSN == "" {
		defaultDSN = dsn.DefaultPostgres
	}
	flag.StringVar(&cfg.DSN, "dsn", defaultDSN, "Postgres DSN (URL form); default $"+dsn.PostgresEnv)
	flag.BoolVar(&cfg.Quick, "quick", false, "smoke mode: every scenario, tiny sizes (seconds)")
	flag.StringVar(&only, "only", "", "comma-separated scenarios to run: "+scenarioKeys()+", catchup (1-3), or their numbers")
	flag.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	flag.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.BoolVar(&cfg.Verbose, "v", false, "print the library's warnings and errors to stderr")
	flag.DurationVar(&timeout, "timeout", 15*time.Minute, "give up (and clean up) after this long")
	flag.Parse()

	var err error
	if cfg.Only, err = parseOnly(only); err != nil {
		fmt.Fprintln(os.Stderr, "subbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "subbench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "subbench:", err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}

	rep, err := run(ctx, cfg, os.Stderr)
	if rep != nil {
		if asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			enc.SetEscapeHTML(false)
			_ = enc.Encode(rep)
		} else {
			printTable(os.Stdout, rep)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "subbench:", err)
		cancel()
		stop()
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func scenarioKeys() string {
	keys := make([]string, len(scenarios))
	for i, s := range scenarios {
		keys[i] = s.key
	}
	return strings.Join(keys, ",")
}

func parseOnly(only string) (map[string]bool, error) {
	if strings.TrimSpace(only) == "" {
		return nil, nil
	}
	sel := map[string]bool{}
	for _, f := range strings.Split(only, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" {
			continue
		}
		if f == "catchup" || f == "catch-up" {
			sel["memory"], sel["postgres"], sel["sqlite"] = true, true, true
			continue
		}
		found := false
		for _, s := range scenarios {
			if f == s.key || f == s.num {
				sel[s.key] = true
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("-only: unknown scenario %q (known: %s, catchup, 1-15)", f, scenarioKeys())
		}
	}
	return sel, nil
}

// run runs the selected scenarios and returns the report. Progress goes to
// progress. The report is returned even on error, with the rows measured
// so far. Every schema and file it created is removed before it returns.
func run(ctx context.Context, cfg config, progress io.Writer) (rep *Report, err error) {
	if progress == nil {
		progress = io.Discard
	}
	started := time.Now()
	mode := "full"
	if cfg.Quick {
		mode = "quick"
	}
	rep = &Report{
		Started:   started.UTC().Truncate(time.Second),
		Mode:      mode,
		GoVersion: runtime.Version(),
		CPUs:      runtime.NumCPU(),
		Loads:     map[string]string{},
	}
	b, err := newBench(ctx, cfg, progress)
	if err != nil {
		return rep, err
	}
	defer func() {
		if cerr := b.cleanup(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		rep.Duration = time.Since(started).Round(100 * time.Millisecond).String()
		rep.Notes = append(rep.Notes, b.notes...)
	}()
	rep.Postgres = b.pgVersion
	for _, s := range scenarios {
		if cfg.Only != nil && !cfg.Only[s.key] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("interrupted: %w", err)
		}
		before := loadAvg()
		fmt.Fprintf(progress, "subbench: %s. %s (load %s) ...\n", s.num, s.title, before)
		t0 := time.Now()
		b.scenario = s.num + " " + s.title
		logsBefore := b.libLogs.Load()
		rows, err := s.run(ctx, b)
		b.closePools()
		if n := b.libLogs.Load() - logsBefore; n > 0 {
			b.note(fmt.Sprintf("scenario %s: the library logged %d warnings/errors (run with -v to see them)", s.num, n))
		}
		for i := range rows {
			rows[i].Scenario = s.num + " " + s.title
		}
		rep.Rows = append(rep.Rows, rows...)
		after := loadAvg()
		rep.Loads[s.num+" "+s.key] = before + " -> " + after
		fmt.Fprintf(progress, "subbench: %s. %s done in %s (load %s)\n", s.num, s.title, time.Since(t0).Round(100*time.Millisecond), after)
		if err != nil {
			return rep, fmt.Errorf("scenario %s (%s): %w", s.key, s.title, err)
		}
	}
	return rep, nil
}

// loadAvg is the 1-minute load average, or "?".
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return f[0]
}

// newRow builds a row with its ratio and goal verdict.
func newRow(name string, figure, baseline float64, unit, baselineName string) Row {
	r := Row{Case: name, Figure: figure, Baseline: baseline, Unit: unit, BaselineName: baselineName}
	if baseline != 0 && !math.IsNaN(figure) && !math.IsInf(figure/baseline, 0) {
		v := figure / baseline
		r.Ratio = &v
	}
	return r
}

// goal attaches a goal and whether it was met.
func (r Row) goal(text string, met bool) Row {
	r.Goal = text
	r.Met = &met
	return r
}

// undecided attaches a goal the run could not decide, and why.
func (r Row) undecided(text, verdict string) Row {
	r.Goal, r.Met, r.Verdict = text, nil, verdict
	return r
}

func (r Row) note(text string) Row {
	if r.Note != "" {
		r.Note += "; "
	}
	r.Note += text
	return r
}

func printTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "subbench (%s mode): %s, %d CPUs, %s; started %s, took %s\n",
		rep.Mode, rep.GoVersion, rep.CPUs, rep.Postgres, rep.Started.Format(time.RFC3339), rep.Duration)
	fmt.Fprintln(w, "ratio = figure / baseline (throughput: higher is better; latency, statements: lower is better)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tCASE\tFIGURE\tBASELINE\tRATIO\tGOAL\tMET\t")
	last := ""
	for _, r := range rep.Rows {
		scn := r.Scenario
		if scn == last {
			scn = ""
		} else {
			last = scn
		}
		ratio := "-"
		if r.Ratio != nil {
			ratio = fmt.Sprintf("%.3f", *r.Ratio)
		}
		met := r.Verdict
		if r.Met != nil {
			met = "no"
			if *r.Met {
				met = "yes"
			}
		}
		base := formatValue(r.Baseline, r.Unit)
		if r.BaselineName == "" {
			base = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", scn, r.Case, formatValue(r.Figure, r.Unit), base, ratio, r.Goal, met)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "baselines and notes:")
	seen := map[string]bool{}
	last = ""
	for _, r := range rep.Rows {
		if r.Scenario != last {
			last = r.Scenario
			fmt.Fprintf(w, "  %s\n", r.Scenario)
		}
		for _, line := range []string{"baseline: " + r.BaselineName, r.Note} {
			if line == "baseline: " || line == "" || seen[r.Scenario+line] {
				continue
			}
			seen[r.Scenario+line] = true
			fmt.Fprintf(w, "    - %s\n", line)
		}
	}
	if len(rep.Loads) > 0 {
		fmt.Fprintln(w, "load average (1 min) before -> after each scenario:")
		for _, s := range scenarios {
			if l, ok := rep.Loads[s.num+" "+s.key]; ok {
				fmt.Fprintf(w, "  %s %s: %s\n", s.num, s.key, l)
			}
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

func formatValue(v float64, unit string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	switch unit {
	case "ev/s":
		return groupThousands(v) + " ev/s"
	case "ms":
		return strconv.FormatFloat(v, 'f', 2, 64) + " ms"
	case "µs":
		return strconv.FormatFloat(v, 'f', 1, 64) + " µs"
	case "count":
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64) + " " + unit
	}
}

func groupThousands(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
