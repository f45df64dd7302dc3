package infrastructure_test

import (
	"testing"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestMain fails the run if any goroutine outlives the tests.
func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }
