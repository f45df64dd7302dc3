package infrastructure_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
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
	// The tables in a tenant schema that the pool's search_path does not
	// name, reached through WithSchema alone.
	out = append(out, storeBackend{
		name:     "postgres-schema",
		postgres: true,
		open: func(t testing.TB) domain.EventStore {
			tn := dbtest.NewTenant(t)
			return newGormStore(t, tn.DB, infrastructure.WithSchema(tn.Schema))
		},
	})
	out = append(out, storeBackend{
		name:     "postgres-pgbouncer",
		postgres: true,
		open: func(t testing.TB) domain.EventStore {
			return newGormStore(t, openThroughBouncer(dbtest.NewPostgres(t), t))
		},
	})
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

// The feed helpers shared with the other test packages (one home:
// internal/feedtest).
var (
	uniqueID                  = feedtest.UniqueID
	newEvent                  = feedtest.NewEvent
	testCtx                   = feedtest.Context
	ids                       = feedtest.IDs
	positions                 = feedtest.Positions
	sequenceNos               = feedtest.SequenceNos
	requireStrictlyIncreasing = feedtest.RequireStrictlyIncreasing
	// eventually polls a condition, with a deadline: how tests wait for
	// another goroutine or connection to reach a state, never with a bare
	// sleep.
	eventually = feedtest.Eventually
)

// newStoreNoCleanup constructs a store without touching a testing.TB, for
// goroutines other than the test's.
func newStoreNoCleanup(db *gorm.DB) (*infrastructure.GormEventStore, error) {
	return infrastructure.NewGormEventStore(db)
}
