package dbtest

import (
	"testing"

	"go.uber.org/goleak"
)

// VerifyTestMain runs the package's tests and then fails the run if any
// goroutine is still alive: every Run must return on cancellation and
// every pool opened through this package is closed at test cleanup. Use it
// as the body of TestMain.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(m, opts...)
}
