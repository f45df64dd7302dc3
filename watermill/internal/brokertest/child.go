package brokertest

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BuildChild builds the package at pkg (relative to the test's directory)
// into a temporary directory removed at cleanup, and returns the binary.
func BuildChild(t testing.TB, pkg string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goTool, "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("brokertest: go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// output collects a child's stdout and stderr and notices its READY line.
type output struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	once  sync.Once
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	if bytes.Contains(o.buf.Bytes(), []byte("READY ")) {
		o.once.Do(func() { close(o.ready) })
	}
	return len(p), nil
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Child is one running child process.
type Child struct {
	cmd  *exec.Cmd
	out  *output
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// StartChild starts bin; it is killed and reaped at cleanup at the latest.
func StartChild(t testing.TB, bin string, args ...string) *Child {
	t.Helper()
	out := &output{ready: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("brokertest: start %s: %v", bin, err)
	}
	c := &Child{cmd: cmd, out: out, done: make(chan struct{})}
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

// Output is what the child printed so far.
func (c *Child) Output() string { return c.out.String() }

// WaitReady waits (bounded) until the child printed READY.
func (c *Child) WaitReady(t testing.TB) {
	t.Helper()
	select {
	case <-c.out.ready:
	case <-c.done:
		t.Fatalf("child exited before it was ready (%v):\n%s", c.err, c.out)
	case <-time.After(60 * time.Second):
		t.Fatalf("child not ready within 60s:\n%s", c.out)
	}
}

// Kill SIGKILLs the child and requires that the kill is what ended it.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("child had exited before the kill (%v):\n%s", c.err, c.out)
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("brokertest: kill: %v", err)
	}
	<-c.done
	c.requireKilled(t)
}

// WaitKilled waits up to d for the child to SIGKILL itself and reports
// whether it did; a child still running then is left running.
func (c *Child) WaitKilled(t testing.TB, d time.Duration) bool {
	t.Helper()
	select {
	case <-c.done:
		c.requireKilled(t)
		return true
	case <-time.After(d):
		return false
	}
}

// requireKilled requires that a SIGKILL ended the child.
func (c *Child) requireKilled(t testing.TB) {
	t.Helper()
	var exitErr *exec.ExitError
	if !errors.As(c.err, &exitErr) {
		t.Fatalf("child: %v\n%s", c.err, c.out)
	}
	if ws, ok := exitErr.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, not by the SIGKILL:\n%s", c.err, c.out)
	}
}

// Term asks the child to stop (SIGTERM) and requires a clean exit.
func (c *Child) Term(t testing.TB) {
	t.Helper()
	c.WaitReady(t)
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not stop within 30s of SIGTERM:\n%s", c.out)
	}
	if c.err != nil {
		t.Fatalf("child did not exit cleanly (%v):\n%s", c.err, c.out)
	}
}

// RequireClean fails the test if the child reported a panic or a race.
func (c *Child) RequireClean(t testing.TB) {
	t.Helper()
	for _, bad := range []string{"panic:", "DATA RACE", "fatal error:"} {
		if strings.Contains(c.out.String(), bad) {
			t.Fatalf("child output contains %q:\n%s", bad, c.out)
		}
	}
}
