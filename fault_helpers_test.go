package subscriptions_test

// Shared helpers of the fault and load suite (fault_*_test.go, issue 8).
// Everything is prefixed "fault" so that nothing collides with the other
// test files of the package.
//
// Every test of the suite has a short form that runs in seconds in
// `go test ./...` and a long form, selected with SUBSCRIPTIONS_LONG=1, that
// runs for minutes (faultScale). The long form needs a longer timeout than
// go test's default ten minutes on a loaded machine:
//
//	SUBSCRIPTIONS_LONG=1 SUBSCRIPTIONS_REQUIRE_POSTGRES=1 go test -race -timeout 40m -run Fault .
//
// The tests that terminate backends or count open transactions give their
// pools an application_name of their own (faultAppName) and touch nothing
// else on the shared server.

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
)

// faultLongEnv selects the long form of the fault suite.
const faultLongEnv = "SUBSCRIPTIONS_LONG"

// faultLong reports whether the long form runs.
func faultLong() bool { return os.Getenv(faultLongEnv) == "1" }

// faultScale picks the short or the long figure.
func faultScale(short, long int) int {
	if faultLong() {
		return long
	}
	return short
}

// faultRand returns a seeded generator and logs the seed, so that a failing
// run's random choices can be told apart from a flaky one.
func faultRand(t testing.TB) *rand.Rand {
	var b [8]byte
	_, _ = cryptoRead(b[:])
	seed := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	t.Logf("random seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

var cryptoRead = crand.Read

// faultAppName returns an application_name unique to this test run: the
// tests that terminate backends or count open transactions filter
// pg_stat_activity on it, so that they never touch another test's (or
// another agent's) sessions on the shared server.
func faultAppName() string {
	b := make([]byte, 6)
	_, _ = cryptoRead(b)
	return "fault" + hex.EncodeToString(b)
}

// faultDSN returns dsn (a URL DSN) with the given query parameters set.
func faultDSN(t testing.TB, dsn string, kv ...string) string {
	t.Helper()
	require.Zero(t, len(kv)%2, "faultDSN takes key/value pairs")
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// faultSessions counts the sessions of application_name app in state
// (e.g. "idle in transaction"; "" counts every state).
func faultSessions(t testing.TB, admin *gorm.DB, app, state string) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = ?"
	args := []any{app}
	if state != "" {
		q += " AND state = ?"
		args = append(args, state)
	}
	require.NoError(t, admin.Raw(q, args...).Scan(&n).Error)
	return n
}

// faultRequireNoIdleInTx waits briefly for app's sessions to settle and
// requires that none is left idle in a transaction.
func faultRequireNoIdleInTx(t testing.TB, admin *gorm.DB, app string) {
	t.Helper()
	var n int
	require.Eventually(t, func() bool {
		n = faultSessions(t, admin, app, "idle in transaction") + faultSessions(t, admin, app, "idle in transaction (aborted)")
		return n == 0
	}, 5*time.Second, 20*time.Millisecond, "sessions of %s left idle in transaction", app)
}

// faultTerminate terminates every backend whose application_name is one of
// apps (never the caller's own) and returns how many it terminated.
func faultTerminate(t testing.TB, admin *gorm.DB, apps ...string) int {
	t.Helper()
	var n int
	require.NoError(t, admin.Raw(`SELECT count(*) FROM (
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = ANY(string_to_array(?, ',')) AND pid <> pg_backend_pid()) AS t`,
		strings.Join(apps, ",")).Scan(&n).Error)
	return n
}

// faultRequireExactlyOnce requires got to hold every ID of want exactly
// once and nothing else; it logs (and returns) the duplicates and losses it
// found, so that the figures are reported even when they are zero.
func faultRequireExactlyOnce(t testing.TB, what string, got, want []string) (duplicates, losses int) {
	t.Helper()
	seen := make(map[string]int, len(got))
	for _, id := range got {
		seen[id]++
	}
	var dup, lost, extra []string
	for id, n := range seen {
		if n > 1 {
			dup = append(dup, id)
		}
	}
	wanted := make(map[string]bool, len(want))
	for _, id := range want {
		wanted[id] = true
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id := range seen {
		if !wanted[id] {
			extra = append(extra, id)
		}
	}
	sort.Strings(dup)
	sort.Strings(lost)
	sort.Strings(extra)
	t.Logf("%s: %d events checked, %d duplicates, %d lost, %d unexpected", what, len(want), len(dup), len(lost), len(extra))
	require.Empty(t, dup, "%s: events handled more than once", what)
	require.Empty(t, lost, "%s: events lost", what)
	require.Empty(t, extra, "%s: events that were never appended", what)
	require.Len(t, got, len(want), "%s", what)
	return len(dup), len(lost)
}

// faultFeedIDs returns the IDs of every event of the store's feed, in feed
// order: the ground truth the projections are compared with.
func faultFeedIDs(t testing.TB, store domain.EventStore) []string {
	t.Helper()
	events, err := store.ReadAfter(context.Background(), 0, 0)
	require.NoError(t, err)
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	return ids
}

// faultCheckpoint reads a subscriber's committed checkpoint straight from
// the table (0 when it has none yet).
func faultCheckpoint(t testing.TB, db *gorm.DB, name string) int64 {
	t.Helper()
	var positions []int64
	require.NoError(t, db.Raw("SELECT position FROM subscriber_checkpoints WHERE subscriber = ?", name).Scan(&positions).Error)
	if len(positions) == 0 {
		return 0
	}
	return positions[0]
}

// faultHead returns the feed head.
func faultHead(t testing.TB, store domain.EventStore) int64 {
	t.Helper()
	head, err := store.HeadPosition(context.Background())
	require.NoError(t, err)
	return head
}

// faultWaitCheckpointAtHead waits until name's checkpoint equals the feed
// head, as the parent of a child process sees them.
func faultWaitCheckpointAtHead(t testing.TB, db *gorm.DB, store domain.EventStore, name string, within time.Duration) {
	t.Helper()
	var cp, head int64
	require.Eventually(t, func() bool {
		cp, head = faultCheckpoint(t, db, name), faultHead(t, store)
		return cp == head
	}, within, 10*time.Millisecond, "checkpoint of %q never reached the head", name)
	require.Equal(t, head, cp)
}

// faultWriter appends events on its own goroutine until stopped or until
// it has appended max events: a bounded load generator.
type faultWriter struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	ids    []string
	errors int
	last   error
}

// faultStartWriter appends bursts of 1..burst events (one Append each, to
// one of five aggregates) every interval. Failed appends are counted and
// skipped: their IDs are not recorded, so the feed, not the writer's list,
// is the ground truth when appends can fail.
func faultStartWriter(t testing.TB, store domain.EventStore, eventType string, interval time.Duration, burst, max int) *faultWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &faultWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for i := 0; ; i++ {
			w.mu.Lock()
			n := len(w.ids)
			w.mu.Unlock()
			if n >= max {
				return
			}
			k := 1 + i%burst
			agg := fmt.Sprintf("fault-agg-%d", i%5)
			batch := make([]domain.EventEnvelope[any], k)
			for j := range batch {
				batch[j] = domain.NewEventEnvelope[any](map[string]any{"i": i, "j": j}, agg, eventType, 0)
			}
			// The append is never cancelled by stop: a cancellation racing
			// the commit would leave it unknown whether the events are in.
			actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := store.Append(actx, agg, -1, batch...)
			acancel()
			w.mu.Lock()
			if err != nil {
				w.errors++
				w.last = err
			} else {
				for _, ev := range batch {
					w.ids = append(w.ids, ev.ID)
				}
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// count returns how many events the writer has appended so far.
func (w *faultWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ids)
}

// stop stops the writer (waiting for an append in flight) and returns the
// IDs it appended, the number of failed appends and the last failure.
func (w *faultWriter) stop() (ids []string, failures int, last error) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ids), w.errors, w.last
}

// faultChildBuild is the crash child shared by the tests that run at the
// same time: built once, removed when the last of them ends.
var faultChildBuild struct {
	mu   sync.Mutex
	refs int
	dir  string
	bin  string
}

// faultBuildChild builds internal/cmd/crashchild (with -race when the tests
// run with it, which reuses the packages the test build compiled) and
// returns its path. Tests running concurrently share one build, in a
// temporary directory removed when the last of them ends.
func faultBuildChild(t testing.TB) string {
	t.Helper()
	b := &faultChildBuild
	b.mu.Lock()
	defer b.mu.Unlock()
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.refs--; b.refs == 0 && b.dir != "" {
			_ = os.RemoveAll(b.dir)
			b.dir, b.bin = "", ""
		}
	})
	b.refs++
	if b.bin != "" {
		return b.bin
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir, err := os.MkdirTemp("", "fault-crashchild-")
	require.NoError(t, err)
	bin := filepath.Join(dir, "crashchild")
	args := []string{"build", "-o", bin}
	if faultRace {
		args = append(args, "-race")
	}
	args = append(args, "./internal/cmd/crashchild")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	started := time.Now()
	out, err := exec.CommandContext(ctx, goTool, args...).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
	}
	require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	t.Logf("built the crash child in %v (race: %v)", time.Since(started).Round(time.Millisecond), faultRace)
	b.dir, b.bin = dir, bin
	return bin
}

// faultOutput collects a child's stdout and stderr and notices the READY
// line.
type faultOutput struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	once  sync.Once
}

func (o *faultOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	select {
	case <-o.ready:
	default:
		if bytes.Contains(o.buf.Bytes(), []byte("READY ")) {
			o.once.Do(func() { close(o.ready) })
		}
	}
	return len(p), nil
}

func (o *faultOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// faultChild is one running crash child.
type faultChild struct {
	cmd  *exec.Cmd
	out  *faultOutput
	pid  int
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// faultStartChild starts the crash child; it is killed and reaped at the
// test's cleanup at the latest.
func faultStartChild(t testing.TB, bin string, args ...string) *faultChild {
	t.Helper()
	out := &faultOutput{ready: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	// A race-enabled child would otherwise sleep a second before exiting.
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Stdout = out
	cmd.Stderr = out
	require.NoError(t, cmd.Start())
	c := &faultChild{cmd: cmd, out: out, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// exited reports whether the child has ended.
func (c *faultChild) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// waitReady waits (bounded) until the child printed READY; it fails the
// test with the child's output if the child exits first.
func (c *faultChild) waitReady(t testing.TB) {
	t.Helper()
	select {
	case <-c.out.ready:
	case <-c.done:
		t.Fatalf("child %d exited before it was ready (%v):\n%s", c.pid, c.err, c.out)
	case <-time.After(60 * time.Second):
		t.Fatalf("child %d not ready within 60s:\n%s", c.pid, c.out)
	}
}

// kill SIGKILLs the child, reaps it, and requires that the kill is what
// ended it (a child that died on its own is a failure of its own).
func (c *faultChild) kill(t testing.TB) {
	t.Helper()
	if c.exited() {
		t.Fatalf("child %d had already exited before the kill (%v):\n%s", c.pid, c.err, c.out)
	}
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("child %d survived SIGKILL for 30s", c.pid)
	}
	var exitErr *exec.ExitError
	require.True(t, errors.As(c.err, &exitErr), "child %d: %v\n%s", c.pid, c.err, c.out)
	ws, ok := exitErr.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"child %d ended with %v, not by the SIGKILL:\n%s", c.pid, c.err, c.out)
}

// term asks the child to stop (SIGTERM) and requires a clean exit. It
// waits for READY first: before that the child may not handle SIGTERM yet.
func (c *faultChild) term(t testing.TB) {
	t.Helper()
	c.waitReady(t)
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	c.waitExit(t)
}

// waitExit waits (bounded) for a child that was asked to stop and requires
// a clean exit.
func (c *faultChild) waitExit(t testing.TB) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("child %d did not stop within 30s of SIGTERM:\n%s", c.pid, c.out)
	}
	require.NoError(t, c.err, "child %d did not exit cleanly:\n%s", c.pid, c.out)
}

// faultRequireCleanOutput requires that no child reported a duplicate, a
// data race or a panic.
func faultRequireCleanOutput(t testing.TB, outputs ...string) {
	t.Helper()
	for _, out := range outputs {
		for _, bad := range []string{"DUPLICATE", "WARNING: DATA RACE", "panic:"} {
			require.NotContains(t, out, bad, "a child reported %q:\n%s", bad, out)
		}
	}
}

// faultChildProjectionDDL is the crash child's projection table (the child
// creates it too, idempotently).
func faultCreateChildProjection(t testing.TB, db *gorm.DB, table string) {
	t.Helper()
	require.NoError(t, db.Exec("CREATE TABLE IF NOT EXISTS "+table+
		" (event_id text PRIMARY KEY, position bigint NOT NULL, pid bigint NOT NULL, handled_at bigint NOT NULL)").Error)
}

// faultProjectedIDs returns the event IDs of a projection table in position
// order.
func faultProjectedIDs(t testing.TB, db *gorm.DB, table string) []string {
	t.Helper()
	var ids []string
	require.NoError(t, db.Raw("SELECT event_id FROM "+table+" ORDER BY position").Scan(&ids).Error)
	return ids
}
