package dbtest

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// VerifyTestMain runs the package's tests and then fails the run if any
// goroutine is still alive: every Run must return on cancellation and
// every pool opened through this package is closed at test cleanup. Use it
// as the body of TestMain. It also lets NewCluster keep one initdb'ed
// template for the run, removed at exit (through goleak.Cleanup: opts
// must not give one of their own).
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	clusterTemplates.mu.Lock()
	clusterTemplates.enabled = true
	clusterTemplates.mu.Unlock()
	opts = append(opts, goleak.Cleanup(func(code int) {
		removeClusterTemplate()
		os.Exit(code) // goleak's own exit, which a Cleanup replaces
	}))
	goleak.VerifyTestMain(m, opts...)
}
