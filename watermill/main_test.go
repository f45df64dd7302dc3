package watermill_test

import (
	"testing"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestMain fails the run if a goroutine outlives the tests: subscribers,
// NATS connections, AMQP publishers and proxies all end at cleanup.
func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }
