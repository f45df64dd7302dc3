package subscriptionstest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any goroutine outlives the examples.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
