package subscriptionstest_test

import (
	"flag"
	"fmt"
	"testing"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// conformance is what a backend's test function does: one suite per
// interface, each with a harness that builds a fresh instance per case.
// Here, this module's in-memory implementations.
func conformance(t *testing.T) {
	subscriptionstest.RunEventStoreSuite(t, subscriptionstest.EventStoreHarness{
		Name: "MemoryStore",
		New: func(t *testing.T) domain.EventStore {
			s := infrastructure.NewMemoryStore()
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		MaxIdentifierBytes: infrastructure.MaxIdentifierBytes,
	})
	subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
		Name: "MemoryCheckpointStore",
		New: func(*testing.T) (store, competitor subscriptions.CheckpointStore) {
			s := subscriptions.NewMemoryCheckpointStore()
			return s, s // one process: the competitor is the same store
		},
	})
	subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
		Name: "MemoryParkingLot",
		New:  func(*testing.T) subscriptions.ParkingLot { return subscriptions.NewMemoryParkingLot() },
	})
}

// Example runs the three suites against the in-memory backends. In a
// backend's own package the body of conformance is simply a test,
// func TestMyBackend(t *testing.T); an example has no *testing.T, so this
// one hands conformance to testing.RunTests (quietly, so that go test -v
// does not print into the example's output).
func Example() {
	ok := runTest("Example", conformance)
	fmt.Println("memory backends conform:", ok)
	// Output: memory backends conform: true
}

// runTest runs f as a test named name and reports whether it passed.
func runTest(name string, f func(*testing.T)) bool {
	if v := flag.Lookup("test.v"); v != nil {
		old := v.Value.String()
		_ = v.Value.Set("false")
		defer func() { _ = v.Value.Set(old) }()
	}
	all := func(string, string) (bool, error) { return true, nil }
	return testing.RunTests(all, []testing.InternalTest{{Name: name, F: f}})
}
