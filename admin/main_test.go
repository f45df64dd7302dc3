package admin_test

import (
	"testing"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestMain fails the run if a goroutine outlives the tests: a subscriber's
// Run, a pool, or a handler's sampler that Close did not end.
func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }
