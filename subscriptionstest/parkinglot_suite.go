package subscriptionstest

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// ParkingLotHarness tells RunParkingLotSuite how to build the
// subscriptions.ParkingLot under test.
type ParkingLotHarness struct {
	// Name names the subtest the suite runs in ("memory", "postgres", ...).
	Name string
	// New returns a fresh, empty lot for one test. Release what it opens
	// with t.Cleanup.
	New func(t *testing.T) subscriptions.ParkingLot
	// Transactional reports that the lot is database-backed: it stores
	// free text as valid UTF-8 without NUL characters, and Replay hands
	// the handler its transaction (subscriptions.TxFromContext).
	Transactional bool
	// InTx reports whether ctx carries a usable transaction of the
	// backend (a SELECT 1 through it succeeds): the one handed to
	// handlers, resets and replays. Nil means subscriptions.TxFromContext,
	// the *gorm.DB of this module's GORM backend; a backend whose handlers
	// get another kind of transaction (pgxstore's pgx.Tx) sets it.
	InTx func(ctx context.Context) bool
	// Parallel runs this backend's cases alongside the test binary's other
	// parallel tests (t.Parallel on the Name subtest, so that the suites of
	// several backends overlap while each waits on its database). Set it
	// when New's stores share nothing with other tests, e.g. a database or
	// schema of their own. The cases of one backend still run one after
	// another.
	Parallel bool
}

// parkLotBackend is the harness as the cases read it.
type parkLotBackend struct {
	name string
	new  func(t *testing.T) subscriptions.ParkingLot
	db   bool
	inTx func(ctx context.Context) bool
}

// parkIncompressible returns n printable bytes that no compressor can
// shrink (deterministic per seed).
func parkIncompressible(seed uint64, n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// parkAt is a timestamp at the precision every backend keeps.
func parkAt(offset time.Duration) time.Time {
	return time.Date(2025, 3, 4, 5, 6, 7, 891011000, time.UTC).Add(offset)
}

func parkEntry(subscriber, eventID string, position int64) subscriptions.ParkedEvent {
	return subscriptions.ParkedEvent{
		Subscriber:  subscriber,
		EventID:     eventID,
		EventType:   "park.suite",
		Position:    position,
		Error:       "park: failed at " + eventID,
		Attempts:    3,
		ParkedAt:    parkAt(time.Duration(position) * time.Second),
		AggregateID: "agg-" + eventID,
	}
}

// parkRequireSame compares two entries, the time by instant.
func parkRequireSame(t *testing.T, want, got subscriptions.ParkedEvent) {
	t.Helper()
	require.True(t, want.ParkedAt.Equal(got.ParkedAt), "parked_at: want %v, got %v", want.ParkedAt, got.ParkedAt)
	want.ParkedAt, got.ParkedAt = time.Time{}, time.Time{}
	require.Equal(t, want, got)
}

// RunParkingLotSuite runs the behavioural contract of
// subscriptions.ParkingLot against the lot h builds, as subtests of t
// named h.Name/<case>. Every case gets a fresh lot from h.New. Cases run
// one after another; a case may run goroutines of its own, all ended
// before it returns. A lot that also implements
// subscriptions.ManagedParkingLot runs the "managed" cases (get, filtered
// and paged listing, discard, recorded replay failures); others skip them.
func RunParkingLotSuite(t *testing.T, h ParkingLotHarness) {
	ctx := context.Background()
	// One backend; the loop keeps the cases where they were written.
	for _, b := range []parkLotBackend{{name: h.Name, new: h.New, db: h.Transactional, inTx: h.InTx}} {
		t.Run(b.name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			t.Run("empty list is an empty non-nil slice", func(t *testing.T) {
				lot := b.new(t)
				got, err := lot.List(ctx, "park-nobody")
				require.NoError(t, err)
				require.NotNil(t, got)
				require.Empty(t, got)
			})

			t.Run("list is ordered by position and per subscriber", func(t *testing.T) {
				lot := b.new(t)
				entries := []subscriptions.ParkedEvent{
					parkEntry("park-a", "ev-30", 30),
					parkEntry("park-a", "ev-10", 10),
					parkEntry("park-b", "ev-15", 15),
					parkEntry("park-a", "ev-20", 20),
					parkEntry("park-a", "ev-05", 5),
				}
				for _, p := range entries {
					require.NoError(t, lot.Park(ctx, p))
				}
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Len(t, got, 4)
				for i, want := range []subscriptions.ParkedEvent{entries[4], entries[1], entries[3], entries[0]} {
					parkRequireSame(t, want, got[i])
				}
				got, err = lot.List(ctx, "park-b")
				require.NoError(t, err)
				require.Len(t, got, 1)
				parkRequireSame(t, entries[2], got[0])
			})

			t.Run("re-park updates the entry", func(t *testing.T) {
				lot := b.new(t)
				first := parkEntry("park-a", "ev-1", 7)
				require.NoError(t, lot.Park(ctx, first))
				again := first
				again.Error = "park: a different failure"
				again.Attempts = 6
				again.ParkedAt = first.ParkedAt.Add(time.Hour)
				require.NoError(t, lot.Park(ctx, again))
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Len(t, got, 1, "re-parking must not add a second entry")
				parkRequireSame(t, again, got[0])
			})

			t.Run("invalid UTF-8 and NUL in texts are stored", func(t *testing.T) {
				lot := b.new(t)
				p := parkEntry("park-a", "ev-1", 1)
				p.Error = "before \xff\xfe bad bytes, a NUL \x00 and after"
				p.EventType = "park.\xc3(type\x00"
				require.NoError(t, lot.Park(ctx, p), "a hostile error text must not make parking fail")
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Len(t, got, 1)
				require.Equal(t, p.EventID, got[0].EventID)
				for _, s := range []string{got[0].Error, got[0].EventType} {
					if b.db {
						require.True(t, utf8.ValidString(s), "stored text %q is not valid UTF-8", s)
						require.NotContains(t, s, "\x00")
					}
				}
				require.True(t, strings.HasPrefix(got[0].Error, "before "), got[0].Error)
				require.Contains(t, got[0].Error, " bad bytes, a NUL ")
				require.True(t, strings.HasSuffix(got[0].Error, " and after"), got[0].Error)
				require.True(t, strings.HasPrefix(got[0].EventType, "park."), got[0].EventType)
				require.Contains(t, got[0].EventType, "(type")
				if !b.db {
					require.Equal(t, p.Error, got[0].Error, "the memory lot keeps the text as given")
				}
			})

			t.Run("hostile names are stored and found exactly", func(t *testing.T) {
				lot := b.new(t)
				names := []string{
					"park",
					"park'",
					`park"; DROP TABLE parked_events; --`,
					"park' OR '1'='1",
					`pa%rk_\`,
					"パーク-🚗-ünïcödé",
					strings.Repeat("x", 1000),
					strings.Repeat("é", 1000),
				}
				ids := []string{
					"ev",
					"ev'",
					`ev"; DELETE FROM parked_events; --`,
					"ev%_\\",
					"事件-🎉",
					strings.Repeat("i", 1000),
					strings.Repeat("ü", 1000),
				}
				var want []subscriptions.ParkedEvent
				for i, sub := range names {
					for j, id := range ids {
						p := parkEntry(sub, id, int64(j+1))
						p.Attempts = i*100 + j
						require.NoError(t, lot.Park(ctx, p), "park %q/%q", sub, id)
						want = append(want, p)
					}
				}
				for i, sub := range names {
					got, err := lot.List(ctx, sub)
					require.NoError(t, err)
					require.Len(t, got, len(ids), "subscriber %q", sub)
					for j := range ids {
						parkRequireSame(t, want[i*len(ids)+j], got[j])
					}
				}
				// Replay clears exactly the addressed entry.
				victim := want[2*len(ids)+2]
				require.NoError(t, lot.Replay(ctx, victim.Subscriber, victim.EventID, domain.EventEnvelope[any]{ID: victim.EventID},
					func(context.Context, domain.EventEnvelope[any]) error { return nil }))
				for i, sub := range names {
					got, err := lot.List(ctx, sub)
					require.NoError(t, err)
					n := len(ids)
					if i == 2 {
						n--
					}
					require.Len(t, got, n, "subscriber %q", sub)
					for _, p := range got {
						require.False(t, p.Subscriber == victim.Subscriber && p.EventID == victim.EventID, "the replayed entry is still listed")
					}
				}
			})

			t.Run("names at the documented length bounds are stored", func(t *testing.T) {
				lot := b.new(t)
				sub := parkIncompressible(1, subscriptions.MaxSubscriberNameBytes)
				id := parkIncompressible(2, infrastructure.MaxIdentifierBytes)
				p := parkEntry(sub, id, 1)
				require.NoError(t, lot.Park(ctx, p))
				got, err := lot.List(ctx, sub)
				require.NoError(t, err)
				require.Len(t, got, 1)
				parkRequireSame(t, p, got[0])
			})

			t.Run("invalid entries are refused", func(t *testing.T) {
				lot := b.new(t)
				for name, p := range map[string]subscriptions.ParkedEvent{
					"empty subscriber": parkEntry("", "ev", 1),
					"empty event ID":   parkEntry("park-a", "", 1),
					"NUL in name":      parkEntry("park\x00a", "ev", 1),
					"invalid UTF-8":    parkEntry("park\xff", "ev", 1),
				} {
					require.Error(t, lot.Park(ctx, p), name)
				}
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Empty(t, got)
			})

			t.Run("a replay racing a running replay is ErrReplayInProgress", func(t *testing.T) {
				lot := b.new(t)
				require.NoError(t, lot.Park(ctx, parkEntry("park-a", "ev-race", 1)))
				ev := domain.EventEnvelope[any]{ID: "ev-race", EventType: "park.suite", Position: 1}
				var runs atomic.Int32
				entered, release := make(chan struct{}, 2), make(chan struct{})
				releaseOnce := sync.OnceFunc(func() { close(release) })
				defer releaseOnce()
				handler := func(context.Context, domain.EventEnvelope[any]) error {
					runs.Add(1)
					entered <- struct{}{}
					<-release
					return nil
				}
				first := make(chan error, 1)
				go func() { first <- lot.Replay(ctx, "park-a", "ev-race", ev, handler) }()
				select {
				case <-entered:
				case <-time.After(30 * time.Second):
					t.Fatal("the first replay never ran its handler")
				}

				// The loser must answer while the winner still runs: waiting
				// for it would be a different answer (and, here, a deadlock).
				second := make(chan error, 1)
				go func() {
					second <- lot.Replay(ctx, "park-a", "ev-race", ev, func(context.Context, domain.EventEnvelope[any]) error {
						runs.Add(1)
						return nil
					})
				}()
				var err error
				select {
				case err = <-second:
				case <-time.After(30 * time.Second):
					releaseOnce()
					t.Fatal("the second replay waited for the first instead of refusing")
				}
				releaseOnce()
				require.ErrorIs(t, err, subscriptions.ErrReplayInProgress, "the loser of a replay race")
				select {
				case err := <-first:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("the first replay did not return")
				}
				require.EqualValues(t, 1, runs.Load(), "the handler ran more than once for one parked entry")
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Empty(t, got, "the winning replay clears the entry")
				err = lot.Replay(ctx, "park-a", "ev-race", ev, handler)
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "a replay after the winner finds the entry gone")
			})

			t.Run("replay", func(t *testing.T) {
				lot := b.new(t)
				p := parkEntry("park-a", "ev-1", 1)
				require.NoError(t, lot.Park(ctx, p))
				ev := domain.EventEnvelope[any]{ID: "ev-1", EventType: "park.suite", Position: 1}

				err := lot.Replay(ctx, "park-a", "ev-unknown", ev, func(context.Context, domain.EventEnvelope[any]) error {
					t.Error("the handler ran for an event that is not parked")
					return nil
				})
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
				err = lot.Replay(ctx, "park-other", "ev-1", ev, func(context.Context, domain.EventEnvelope[any]) error {
					t.Error("the handler ran for another subscriber's entry")
					return nil
				})
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
				require.Error(t, lot.Replay(ctx, "park-a", "ev-1", ev, nil), "nil handler")

				errReplay := errors.New("park: replay failed")
				err = lot.Replay(ctx, "park-a", "ev-1", ev, func(context.Context, domain.EventEnvelope[any]) error { return errReplay })
				require.ErrorIs(t, err, errReplay)
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Len(t, got, 1, "a failed replay leaves the entry")
				parkRequireSame(t, p, got[0])

				var seen domain.EventEnvelope[any]
				var hadTx bool
				require.NoError(t, lot.Replay(ctx, "park-a", "ev-1", ev, func(hctx context.Context, e domain.EventEnvelope[any]) error {
					seen, hadTx = e, inTx(b.inTx, hctx)
					return nil
				}))
				require.Equal(t, ev, seen)
				require.Equal(t, b.db, hadTx, "database-backed replays expose their transaction")
				got, err = lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Empty(t, got, "a successful replay clears the entry")
				err = lot.Replay(ctx, "park-a", "ev-1", ev, func(context.Context, domain.EventEnvelope[any]) error { return nil })
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
			})

			t.Run("purge deletes one subscriber's entries", func(t *testing.T) {
				lot := b.new(t)
				purger := has[subscriptions.ParkingLotPurger](t, lot)
				for _, p := range []subscriptions.ParkedEvent{
					parkEntry("park-a", "ev-1", 1), parkEntry("park-a", "ev-2", 2), parkEntry("park-b", "ev-1", 1),
				} {
					require.NoError(t, lot.Park(ctx, p))
				}
				require.NoError(t, purger.Purge(ctx, "park-a"))
				got, err := lot.List(ctx, "park-a")
				require.NoError(t, err)
				require.Empty(t, got)
				got, err = lot.List(ctx, "park-b")
				require.NoError(t, err)
				require.Len(t, got, 1, "another subscriber's entries stay")
				require.NoError(t, purger.Purge(ctx, "park-nobody"), "purging nothing is not an error")
			})

			t.Run("managed", func(t *testing.T) { parkManagedSuite(t, b) })
		})
	}
	RunDeliveredClearerSuite(t, h)
	RunOrderedParkingLotSuite(t, h)
}
