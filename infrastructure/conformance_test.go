package infrastructure_test

import (
	"testing"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// TestStoreSuite runs the exported domain.EventStore conformance suite
// against MemoryStore and GormEventStore on every database.
func TestStoreSuite(t *testing.T) {
	t.Parallel() // every backend opens a store of its own
	for _, b := range storeBackends() {
		subscriptionstest.RunEventStoreSuite(t, subscriptionstest.EventStoreHarness{
			Name:               b.name,
			Parallel:           true,
			New:                func(t *testing.T) domain.EventStore { return b.open(t) },
			MaxIdentifierBytes: infrastructure.MaxIdentifierBytes,
		})
	}
}
