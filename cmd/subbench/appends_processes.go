package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/coalesce"
)

// appendChildEnv carries the JSON config of a child process of scenario
// 7's multi-process variant (sizes: appendProcs processes of
// appendProcWriters goroutines, each process with its own pool, as several
// application instances appending to one database). Its presence makes
// the binary a child: see main, and TestMain for the test binary.
const appendChildEnv = "SUBBENCH_APPEND_CHILD"

// appendChildConfig is what a child needs.
type appendChildConfig struct {
	DSN         string        `json:"dsn"`
	Variant     string        `json:"variant"`
	Writers     int           `json:"writers"`
	Duration    time.Duration `json:"duration"`
	Tag         string        `json:"tag"`
	LockKey     int64         `json:"lock_key"`
	PreviousKey int64         `json:"previous_key"`
}

// appendChildResult is a child's measurement, one JSON line on stdout.
type appendChildResult struct {
	Events    int64           `json:"events"`
	Elapsed   time.Duration   `json:"elapsed"`
	Latencies []time.Duration `json:"latencies"`
}

// runAppendProcesses measures the library, the previous design and the
// plain baseline with sz.appendProcs processes at once. The children
// warm up, report ready, and start together on the parent's word.
func runAppendProcesses(ctx context.Context, b *bench, dsn string, lockKey, previousKey int64) ([]Row, error) {
	sz := b.sizes()
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable for child processes: %w", err)
	}
	keys := []string{"library", "fixed", "previous", "plain"}
	results := map[string]*appendResult{}
	for round := range sz.appendProcRounds {
		for i := range keys {
			key := keys[(i+round)%len(keys)]
			res, err := appendProcessRound(ctx, exe, sz.appendProcs, appendChildConfig{
				DSN: dsn, Variant: key, Writers: sz.appendProcWriters, Duration: sz.appendDuration,
				Tag: fmt.Sprintf("mp-%s-r%d", key, round), LockKey: lockKey, PreviousKey: previousKey,
			})
			if err != nil {
				return nil, fmt.Errorf("%d processes x %d writers, %s: %w", sz.appendProcs, sz.appendProcWriters, key, err)
			}
			if results[key] == nil {
				results[key] = &appendResult{}
			}
			results[key].events += res.events
			results[key].elapsed += res.elapsed
			results[key].latencies = append(results[key].latencies, res.latencies...)
		}
	}
	lib, fixed, prev, plain := results["library"], results["fixed"], results["previous"], results["plain"]
	ll, fl, pl, bl := sortedCopy(lib.latencies), sortedCopy(fixed.latencies), sortedCopy(prev.latencies), sortedCopy(plain.latencies)
	name := fmt.Sprintf("%d processes x %d writers", sz.appendProcs, sz.appendProcWriters)
	note := fmt.Sprintf("%s: separate processes, each with its own pool of %d connections, started together after warming up; append latency p50/p99: library %.2f/%.2f ms, library with two transactions in flight %.2f/%.2f ms, previous design %.2f/%.2f ms, plain %.2f/%.2f ms",
		name, sz.appendProcWriters+1, percentile(ll, 50), percentile(ll, 99), percentile(fl, 50), percentile(fl, 99), percentile(pl, 50), percentile(pl, 99), percentile(bl, 50), percentile(bl, 99))
	return []Row{
		newRow(name+": GormEventStore.Append", lib.rate(), plain.rate(), "ev/s", plainAppendName+", from the same processes").
			goal(">= 0.6", lib.rate() >= 0.6*plain.rate()).note(note),
		newRow(name+": library, two in flight", fixed.rate(), plain.rate(), "ev/s", plainAppendName+", from the same processes").
			note("library, two in flight: GormEventStore.Append with internal/coalesce.FixedInFlight, each process keeping two append transactions in flight although the others append too (the design before the adaptive limit)"),
		newRow(name+": previous design", prev.rate(), plain.rate(), "ev/s", plainAppendName+", from the same processes"),
	}, nil
}

// appendProcessRound runs one variant in procs children at once
// and sums their events over the longest child's elapsed time.
func appendProcessRound(ctx context.Context, exe string, procs int, cfg appendChildConfig) (appendResult, error) {
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	var children []*child
	defer func() {
		for _, c := range children {
			_ = c.stdin.Close()
			if c.cmd.Process != nil {
				_ = c.cmd.Process.Kill()
			}
			_ = c.cmd.Wait()
		}
	}()
	for p := range procs {
		pc := cfg
		pc.Tag = fmt.Sprintf("%s-p%d", cfg.Tag, p)
		conf, err := json.Marshal(pc)
		if err != nil {
			return appendResult{}, err
		}
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), appendChildEnv+"="+string(conf))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return appendResult{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return appendResult{}, err
		}
		if err := cmd.Start(); err != nil {
			return appendResult{}, fmt.Errorf("start child: %w", err)
		}
		children = append(children, &child{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)})
	}
	for _, c := range children {
		line, err := c.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			return appendResult{}, fmt.Errorf("child did not get ready: %q %v", line, err)
		}
	}
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return appendResult{}, err
		}
	}
	var total appendResult
	for _, c := range children {
		line, err := c.out.ReadString('\n')
		if err != nil {
			return appendResult{}, fmt.Errorf("child result: %w", err)
		}
		var r appendChildResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return appendResult{}, fmt.Errorf("child result %q: %w", line, err)
		}
		total.events += r.Events
		total.elapsed = max(total.elapsed, r.Elapsed)
		total.latencies = append(total.latencies, r.Latencies...)
	}
	return total, nil
}

// runAppendChild is a child process's whole life: warm up, say "ready",
// wait for "go" on stdin, append for the configured time, print the
// result as one JSON line.
func runAppendChild(conf string) error {
	var cfg appendChildConfig
	if err := json.Unmarshal([]byte(conf), &cfg); err != nil {
		return fmt.Errorf("child config: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+5*time.Minute)
	defer cancel()
	b := &bench{}
	defer b.closePools()
	key := cfg.Variant
	if key == "fixed" {
		key = "library" // with coalesce.FixedInFlight
	}
	var variant *appendVariant
	for _, v := range appendVariants(cfg.LockKey, cfg.PreviousKey) {
		if v.key == key {
			variant = &v
		}
	}
	if variant == nil {
		return errors.New("child: unknown variant " + strconv.Quote(cfg.Variant))
	}
	// One pool of the variant's backend: a pgx one for pgxstore's store,
	// the GORM one (whose pgx connections the hand-written appends use)
	// otherwise.
	var target appendTarget
	if key == "single-pgx" {
		pdb, err := pgxBackend.open(ctx, b, cfg.DSN, "", cfg.Writers+1, nil)
		if err != nil {
			return err
		}
		target.pgx = pdb.store
	} else {
		db, err := b.openPG(cfg.DSN, cfg.Writers+1, nil)
		if err != nil {
			return err
		}
		if target.gorm, err = infrastructure.NewGormEventStore(db); err != nil {
			return err
		}
		target.db = db
	}
	coalesce.Disabled.Store(cfg.Variant == "uncoalesced")
	coalesce.FixedInFlight.Store(cfg.Variant == "fixed")
	stdin := bufio.NewReader(os.Stdin)
	res, err := timedWriters(ctx, cfg.Writers, cfg.Duration, variant.events(), variant.appendOne(target, cfg.Tag), func() error {
		fmt.Println("ready")
		line, err := stdin.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "go" {
			return fmt.Errorf("child: no go from the parent: %q %v", line, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(appendChildResult{Events: res.events, Elapsed: res.elapsed, Latencies: res.latencies})
}
