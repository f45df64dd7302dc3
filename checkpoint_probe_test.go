package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// proberPair is two checkpoint stores a CheckpointProber suite probes
// together: on Postgres two schemas of one database (own is false), on
// SQLite and memory one store twice (own: the same tables).
type proberPair struct {
	a, b subscriptions.CheckpointStore
	same bool
}

// TestCheckpointProber runs the CheckpointProber behaviour on every
// backend: memory, the GORM store on SQLite (both drivers), on Postgres
// through search_path and through WithSchema, and pgxstore's through
// search_path and WithSchema. The probe reads each store's own rows
// (position, 0 without a row; paused by its pause key), whichever store's
// connection runs it, and sees a commit, a reset, a pause and a resume
// made through the stores; a store of another kind is ErrUnsupported.
func TestCheckpointProber(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	backends := []struct {
		name string
		new  func(t *testing.T) proberPair
	}{
		{"memory", func(*testing.T) proberPair {
			s := subscriptions.NewMemoryCheckpointStore()
			return proberPair{a: s, b: s, same: true}
		}},
	}
	for _, b := range gormStoreBackends() {
		backends = append(backends, struct {
			name string
			new  func(t *testing.T) proberPair
		}{b.Name, func(t *testing.T) proberPair {
			one := openStoreDB(t, b)
			a := coreCheckpointStore(t, one.DB, one.Opts...)
			if !b.Postgres {
				return proberPair{a: a, b: a, same: true}
			}
			two := openStoreDB(t, b)
			return proberPair{a: a, b: coreCheckpointStore(t, two.DB, two.Opts...)}
		}})
	}
	pgxStore := func(t *testing.T, schema bool) subscriptions.CheckpointStore {
		if schema {
			tn := dbtest.NewTenant(t)
			s, err := pgxstore.NewCheckpointStore(ctx, tn.OpenPgx(t), pgxstore.WithSchema(tn.Schema))
			require.NoError(t, err)
			return s
		}
		s, err := pgxstore.NewCheckpointStore(ctx, dbtest.NewPostgres(t).OpenPgx(t))
		require.NoError(t, err)
		return s
	}
	backends = append(backends,
		struct {
			name string
			new  func(t *testing.T) proberPair
		}{"pgx", func(t *testing.T) proberPair { return proberPair{a: pgxStore(t, false), b: pgxStore(t, false)} }},
		struct {
			name string
			new  func(t *testing.T) proberPair
		}{"pgx-schema", func(t *testing.T) proberPair { return proberPair{a: pgxStore(t, true), b: pgxStore(t, true)} }})

	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			t.Parallel()
			p := bk.new(t)
			names := []string{"x", "y", "z"}
			stores := []subscriptions.CheckpointStore{p.a}
			if !p.same {
				stores = append(stores, p.b)
			}
			probe := func(through subscriptions.CheckpointStore) [][]subscriptions.CheckpointProbe {
				t.Helper()
				prober, ok := through.(subscriptions.CheckpointProber)
				require.True(t, ok, "%T is a CheckpointProber", through)
				got, err := prober.ProbeCheckpoints(ctx, stores, names)
				require.NoError(t, err)
				return got
			}
			zero := make([]subscriptions.CheckpointProbe, len(names))
			if p.same {
				require.Equal(t, [][]subscriptions.CheckpointProbe{zero}, probe(p.a), "no rows yet")
			} else {
				require.Equal(t, [][]subscriptions.CheckpointProbe{zero, zero}, probe(p.a), "no rows yet")
			}

			coreAdvance(t, p.a, "x", 5)
			require.NoError(t, p.b.Reset(ctx, "y", 3))
			_, err := p.a.(subscriptions.Pauser).Pause(ctx, "z", []string{"z"}, "probe test")
			require.NoError(t, err)
			var want [][]subscriptions.CheckpointProbe
			if p.same {
				want = [][]subscriptions.CheckpointProbe{{{Position: 5}, {Position: 3}, {Paused: true}}}
			} else {
				want = [][]subscriptions.CheckpointProbe{
					{{Position: 5}, {}, {Paused: true}},
					{{}, {Position: 3}, {}},
				}
			}
			require.Equal(t, want, probe(p.a))
			require.Equal(t, want, probe(p.b), "whichever store's connection probes, each store's own rows")

			require.NoError(t, p.a.(subscriptions.Pauser).Resume(ctx, "z"))
			require.NoError(t, p.a.Reset(ctx, "x", 1))
			want[0][0], want[0][2] = subscriptions.CheckpointProbe{Position: 1}, subscriptions.CheckpointProbe{}
			require.Equal(t, want, probe(p.a), "a reset and a resume")

			_, err = p.a.(subscriptions.CheckpointProber).ProbeCheckpoints(ctx, []subscriptions.CheckpointStore{p.a, otherKind(p.a)}, names)
			require.True(t, errors.Is(err, errors.ErrUnsupported), "a store of another kind: %v", err)

			// Many names and stores (the stores repeated): more parameters
			// than one Postgres statement binds. (A SQLite probe reads the
			// stores of one file: one store, and a name per definition.)
			if strings.HasPrefix(bk.name, "sqlite") {
				return
			}
			many := append([]string(nil), names...)
			for i := range 297 {
				many = append(many, fmt.Sprintf("unknown-%d", i))
			}
			var reps []subscriptions.CheckpointStore
			for range 120 {
				reps = append(reps, stores...)
			}
			got, err := p.a.(subscriptions.CheckpointProber).ProbeCheckpoints(ctx, reps, many)
			require.NoError(t, err)
			require.Len(t, got, len(reps))
			for i, row := range got {
				require.Len(t, row, len(many))
				require.Equal(t, want[i%len(stores)], row[:len(names)], "store %d", i)
				require.Equal(t, make([]subscriptions.CheckpointProbe, len(many)-len(names)), row[len(names):], "store %d: names without rows", i)
			}
		})
	}
}

// otherKind is a checkpoint store of another kind than s.
func otherKind(s subscriptions.CheckpointStore) subscriptions.CheckpointStore {
	if _, ok := s.(*subscriptions.MemoryCheckpointStore); ok {
		return &wrappedCheckpoints{s}
	}
	return subscriptions.NewMemoryCheckpointStore()
}

// wrappedCheckpoints is a checkpoint store without the capability.
type wrappedCheckpoints struct{ subscriptions.CheckpointStore }

// TestCheckpointProberRefusesPlaceholderSchema: a GORM checkpoint store
// whose pool's search_path selects a schema named with a "?" (which GORM
// would read as a placeholder in the probe's statement, as WithSchema
// refuses it for) is refused by the probe with errors.ErrUnsupported, so
// that a Group does without the probe for its database instead of
// failing its statement every interval.
func TestCheckpointProberRefusesPlaceholderSchema(t *testing.T) {
	t.Parallel()
	dbtest.RequirePostgres(t)
	admin := dbtest.OpenPostgresDSN(t, dbtest.PostgresDSN())
	name := fmt.Sprintf("odd?%d", time.Now().UnixNano())
	require.NoError(t, admin.Exec(`CREATE SCHEMA `+schema.QuoteIdent(name)).Error)
	t.Cleanup(func() { require.NoError(t, admin.Exec(`DROP SCHEMA `+schema.QuoteIdent(name)+` CASCADE`).Error) })
	dsn, err := dbtest.WithSearchPath(dbtest.PostgresDSN(), name)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(dbtest.OpenPostgresDSN(t, dsn))
	require.NoError(t, err)
	_, err = cps.ProbeCheckpoints(context.Background(), []subscriptions.CheckpointStore{cps}, []string{"proj"})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.ErrorContains(t, err, "placeholder")
}
