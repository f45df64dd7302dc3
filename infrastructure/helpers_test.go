package infrastructure_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// storeBackend is one implementation the behavioural suite runs against.
type storeBackend struct {
	name     string
	postgres bool
	// open returns a fresh, empty store, released at the test's cleanup.
	open func(t testing.TB) domain.EventStore
}

// storeBackends lists MemoryStore and every GORM database.
func storeBackends() []storeBackend {
	out := []storeBackend{{
		name: "memory",
		open: func(t testing.TB) domain.EventStore {
			s := infrastructure.NewMemoryStore()
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}}
	for _, b := range dbtest.GormBackends() {
		out = append(out, storeBackend{
			name:     b.Name,
			postgres: b.Postgres,
			open:     func(t testing.TB) domain.EventStore { return newGormStore(t, b.Open(t)) },
		})
		if b.Postgres {
			// The portable append path, used when the pool is not pgx's.
			out = append(out, storeBackend{
				name:     b.Name + "-portable",
				postgres: true,
				open: func(t testing.TB) domain.EventStore {
					s := newGormStore(t, b.Open(t))
					infrastructure.PortableAppendOnly(s)
					return s
				},
			})
		}
	}
	// Schemas applied by goose from migrations.FS, the store built without
	// DDL of its own.
	for _, b := range dbtest.GooseBackends() {
		out = append(out, storeBackend{
			name:     b.Name,
			postgres: b.Postgres,
			open: func(t testing.TB) domain.EventStore {
				return newGormStore(t, b.Open(t), infrastructure.WithSchemaVerifyOnly())
			},
		})
	}
	return out
}

func newGormStore(t testing.TB, db *gorm.DB, opts ...infrastructure.GormEventStoreOption) *infrastructure.GormEventStore {
	t.Helper()
	s, err := infrastructure.NewGormEventStore(db, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var idCounter atomic.Int64

// uniqueID returns an identifier never returned before in this process.
func uniqueID(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, idCounter.Add(1))
}

// newEvent returns an unpersisted envelope with a fresh ID and sequence
// number 0 (assigned by the store).
func newEvent(aggregateID, eventType string, payload any) domain.EventEnvelope[any] {
	return domain.NewEventEnvelope[any](payload, aggregateID, eventType, 0)
}

// testCtx is a context that ends with the test (or after a generous
// safety deadline, so that a hang fails instead of blocking the run).
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ids returns the events' IDs in order.
func ids(events []domain.EventEnvelope[any]) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// positions returns the events' positions in order.
func positions(events []domain.EventEnvelope[any]) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Position
	}
	return out
}

// sequenceNos returns the events' sequence numbers in order.
func sequenceNos(events []domain.EventEnvelope[any]) []int {
	out := make([]int, len(events))
	for i, e := range events {
		out[i] = e.SequenceNo
	}
	return out
}

// requireStrictlyIncreasing fails unless positions increase strictly and
// are all positive.
func requireStrictlyIncreasing(t testing.TB, events []domain.EventEnvelope[any]) {
	t.Helper()
	var last int64
	for i, e := range events {
		require.Greater(t, e.Position, last, "event #%d (%s) is not after the previous position", i, e.ID)
		last = e.Position
	}
}

// eventually polls cond until it holds or the deadline passes. It is how
// tests wait for another goroutine or connection to reach a state, never
// with a bare sleep.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newStoreNoCleanup constructs a store without touching a testing.TB, for
// goroutines other than the test's.
func newStoreNoCleanup(db *gorm.DB) (*infrastructure.GormEventStore, error) {
	return infrastructure.NewGormEventStore(db)
}
