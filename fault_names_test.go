package subscriptions_test

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
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
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// faultHostile returns n characters drawn from quotes, semicolons, SQL
// comment and placeholder syntax, backslashes, LIKE wildcards and
// multi-byte Unicode (two, three and four bytes), shuffled by rng.
func faultHostile(rng *rand.Rand, n int) string {
	alphabet := []rune(`'";-%_\?$@:/*()[]{}` + "aZ09 \t\n" + "üéñ€名前日本語🚀😀\u202e\u200d")
	var b strings.Builder
	for range n {
		b.WriteRune(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

// faultOfBytes returns a valid UTF-8 string of exactly n bytes made of
// multi-byte characters, topped up with ASCII.
func faultOfBytes(n int, unit string) string {
	s := strings.Repeat(unit, n/len(unit))
	return s + strings.Repeat("x", n-len(s))
}

// TestFaultHostileNames runs subscribers whose names, and events whose IDs,
// aggregate IDs and types, contain quotes, semicolons, SQL fragments,
// backslashes, LIKE wildcards, Unicode, 1,000 characters or exactly the
// maximum byte length, through a full run with checkpoints and parking:
// everything is stored and found exactly (bound parameters everywhere),
// nothing leaks between names that differ only in a suffix or a wildcard,
// and a value one byte over the maximum is a clear error, never a
// truncation.
func TestFaultHostileNames(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		faultHostileNames(t, gormEnv(t, "postgres", pg.DB, pg))
	})
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		faultHostileNames(t, pgxEnv(t))
	})
	t.Run("sqlite-file", func(t *testing.T) {
		t.Parallel()
		db := dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(filepath.Join(t.TempDir(), "names.db")))
		faultHostileNames(t, gormEnv(t, "sqlite-file", db, nil))
	})
}

func faultHostileNames(t *testing.T, e *env) {
	ctx := context.Background()
	rng := faultRand(t)
	db, store, cps, lot := e.DB, e.Events, e.Checkpoints, e.Parking
	var err error
	const table = "fault_names_proj"
	require.NoError(t, db.Exec("CREATE TABLE "+table+" (subscriber text NOT NULL, event_id text NOT NULL, position bigint NOT NULL)").Error)

	maxName := faultOfBytes(subscriptions.MaxSubscriberNameBytes, "€")
	names := []string{
		`O'Brien's "subscriber"; DROP TABLE subscriber_checkpoints; --`,
		`'); DELETE FROM parked_events WHERE ('1'='1`,
		`semi;colon;;`,
		`back\slash\\ \' \"`,
		`%`, `_`, `%_%`,
		`$1 ? @p1 :name /* comment */`,
		"ünïcødé 名前 🚀 \u202eRTL\u202c zero\u200dwidth",
		" leading and trailing space ",
		faultHostile(rng, 1000),
		strings.Repeat(`'";`, 333) + "ü",
		maxName,
	}
	require.Equal(t, 1000, utf8.RuneCountInString(names[len(names)-3]))
	require.Equal(t, 1000, utf8.RuneCountInString(names[len(names)-2]))
	require.Len(t, maxName, subscriptions.MaxSubscriberNameBytes)

	maxID := faultOfBytes(infrastructure.MaxIdentifierBytes, "名")
	type hostileEvent struct {
		id, agg, typ string
		poison       bool
	}
	hostile := []hostileEvent{
		{id: `ev'1"; DROP TABLE events; --`, agg: `agg'; --`, typ: `type.'quoted";x`},
		{id: `ev;2;`, agg: `agg;2`, typ: "type.;", poison: true},
		{id: "ünï-名前-🚀-ev3", agg: "agg-名前", typ: "type.ü"},
		{id: `%`, agg: `%`, typ: `%.%`},
		{id: `ev\5\\'`, agg: `agg\`, typ: `type.\`},
		{id: faultHostile(rng, 1000), agg: faultHostile(rng, 1000), typ: "type.long"},
		// Parked for every name, the 1,000-character ones included: it
		// must compress for the pair to fit Postgres's index entry limit
		// (see TestFaultHostileMaxLengthParking).
		{id: strings.Repeat(`;'"ü`, 250), agg: `agg'"`, typ: "type.long", poison: true},
		{id: maxID, agg: faultOfBytes(infrastructure.MaxIdentifierBytes, "ü"), typ: "type.max"},
	}
	var ids, poison []string
	isPoison := map[string]bool{}
	for i, h := range hostile {
		// Ordinary events around each hostile one.
		appendN(t, store, "fault.names", i*2, 2)
		ev := domain.NewEventEnvelope[any](map[string]any{"id": h.id}, h.agg, h.typ, 0)
		ev.ID = h.id
		ev.TransactionID = h.id
		require.NoError(t, store.Append(ctx, h.agg, -1, ev), "append event %q", h.id)
		ids = append(ids, h.id)
		if h.poison {
			poison = append(poison, h.id)
			isPoison[h.id] = true
		}
	}
	feed := faultFeedIDs(t, store)
	head := faultHead(t, store)
	for _, id := range ids {
		require.Contains(t, feed, id)
		got, err := store.GetEventByID(ctx, id)
		require.NoError(t, err)
		require.Equal(t, id, got.ID)
	}
	var others []string
	for _, id := range feed {
		if !isPoison[id] {
			others = append(others, id)
		}
	}

	// A full run for every name at once.
	var fixed atomic.Bool
	subs := make([]*subscriptions.Subscriber, len(names))
	runs := make([]*running, len(names))
	var mu sync.Mutex
	for i, name := range names {
		handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
			if isPoison[ev.ID] && !fixed.Load() {
				return errors.New("poison " + ev.ID + " for " + name)
			}
			return e.Exec(ctx, "INSERT INTO "+table+" (subscriber, event_id, position) VALUES (?, ?, ?)", name, ev.ID, ev.Position)
		}
		sub, err := subscriptions.NewSubscriber(name, store, cps, handler,
			subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(0),
			subscriptions.WithBatchSize(3), subscriptions.WithPollInterval(10*time.Millisecond),
			subscriptions.WithLogger(quietLogger()))
		require.NoError(t, err, "NewSubscriber(%q)", name)
		require.Equal(t, name, sub.Name())
		mu.Lock()
		subs[i], runs[i] = sub, start(t, sub)
		mu.Unlock()
	}
	for i, name := range names {
		faultWaitCheckpointAtHead(t, db, store, name, time.Minute)
		runs[i].stop(t)
	}

	// Stored and found exactly.
	var stored []string
	require.NoError(t, db.Raw("SELECT subscriber FROM subscriber_checkpoints").Scan(&stored).Error)
	require.ElementsMatch(t, names, stored, "the checkpoint table holds exactly the names")
	for i, name := range names {
		position, err := cps.Position(ctx, name)
		require.NoError(t, err)
		require.Equal(t, head, position, "checkpoint of %q", name)
		lag, err := subs[i].Lag(ctx)
		require.NoError(t, err)
		require.Zero(t, lag)

		parked, err := subs[i].ListParked(ctx)
		require.NoError(t, err)
		require.Len(t, parked, len(poison), "parked for %q", name)
		for j, p := range parked {
			require.Equal(t, name, p.Subscriber)
			require.Equal(t, poison[j], p.EventID)
			require.Equal(t, "poison "+poison[j]+" for "+name, p.Error, "the error text is stored exactly")
		}
		var got []string
		require.NoError(t, db.Raw("SELECT event_id FROM "+table+" WHERE subscriber = ? ORDER BY position", name).Scan(&got).Error)
		require.Equal(t, others, got, "projection of %q", name)
	}
	// Near misses find nothing: no truncation, no pattern matching.
	for _, miss := range []string{names[0] + " ", "O'Brien", "%%", "__", strings.TrimSpace(names[9]), maxName[:len(maxName)-1]} {
		position, err := cps.Position(ctx, miss)
		require.NoError(t, err)
		require.Zero(t, position, "a name that was never used (%q) has a checkpoint", miss)
		parked, err := lot.List(ctx, miss)
		require.NoError(t, err)
		require.Empty(t, parked, "a name that was never used (%q) has parked events", miss)
	}

	// Replay every hostile parked event after the fix.
	fixed.Store(true)
	for _, sub := range subs {
		for _, id := range poison {
			require.NoError(t, sub.ReplayParked(ctx, id), "replay %q for %q", id, sub.Name())
		}
		parked, err := sub.ListParked(ctx)
		require.NoError(t, err)
		require.Empty(t, parked)
		var got []string
		require.NoError(t, db.Raw("SELECT event_id FROM "+table+" WHERE subscriber = ?", sub.Name()).Scan(&got).Error)
		require.ElementsMatch(t, feed, got, "projection of %q after the replay", sub.Name())
	}

	// One byte over the limit: a clear error, never a truncation.
	overName := maxName + "x"
	_, err = subscriptions.NewSubscriber(overName, store, cps, func(context.Context, domain.EventEnvelope[any]) error { return nil })
	require.ErrorContains(t, err, fmt.Sprintf("at most %d", subscriptions.MaxSubscriberNameBytes))
	_, err = subscriptions.NewSubscriber(strings.Repeat("€", 683), store, cps, func(context.Context, domain.EventEnvelope[any]) error { return nil })
	require.ErrorContains(t, err, "2049 bytes", "683 three-byte characters are 2049 bytes")
	_, acquired, err := cps.Acquire(ctx, overName)
	require.Error(t, err)
	require.False(t, acquired)
	require.Error(t, cps.Reset(ctx, overName, 1))
	require.Error(t, lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: overName, EventID: "x", Position: 1}))
	position, err := cps.Position(ctx, overName)
	if err == nil {
		require.Zero(t, position, "the overlong name found the checkpoint of its truncation")
	}
	var overlong int64
	require.NoError(t, db.Raw("SELECT count(*) FROM subscriber_checkpoints WHERE length(subscriber) <> ?", 0).Scan(&overlong).Error)
	require.EqualValues(t, len(names), overlong, "rows appeared for rejected names")
	for _, bad := range []string{"nul\x00byte", "invalid \xff utf-8"} {
		_, err = subscriptions.NewSubscriber(bad, store, cps, func(context.Context, domain.EventEnvelope[any]) error { return nil })
		require.Error(t, err, "name %q", bad)
	}

	overID := maxID + "x"
	ev := domain.NewEventEnvelope[any](map[string]any{}, "agg-over", "fault.over", 0)
	ev.ID = overID
	err = store.Append(ctx, "agg-over", -1, ev)
	require.ErrorIs(t, err, domain.ErrInvalidEvent)
	require.ErrorContains(t, err, fmt.Sprintf("at most %d", infrastructure.MaxIdentifierBytes))
	ev = domain.NewEventEnvelope[any](map[string]any{}, maxID+"x", "fault.over", 0)
	require.ErrorIs(t, store.Append(ctx, maxID+"x", -1, ev), domain.ErrInvalidEvent, "overlong aggregate ID")
	_, err = store.GetEventByID(ctx, overID)
	require.ErrorIs(t, err, domain.ErrInvalidEvent, "an overlong ID must not find the event of its truncation")
	require.Equal(t, head, faultHead(t, store), "a rejected append stored something")
}

// TestFaultHostileMaxLengthParking parks an event whose ID is as long as an
// event ID may be (MaxIdentifierBytes) for a subscriber whose name is as
// long as a name may be (MaxSubscriberNameBytes), both of text that does
// not compress — and, likewise, a 1,000-character hostile name and event
// ID: the values are within their limits, so the event must be parked like
// any other.
func TestFaultHostileMaxLengthParking(t *testing.T) {
	t.Parallel()
	rng := faultRand(t)
	cases := []struct{ what, name, id string }{
		{"max", faultIncompressible(rng, subscriptions.MaxSubscriberNameBytes), faultIncompressible(rng, infrastructure.MaxIdentifierBytes)},
		{"1000-characters", faultHostile(rng, 1000), faultHostile(rng, 1000)},
	}
	for _, b := range dbEnvs() {
		if b.Name == "sqlite-memory" {
			continue
		}
		for _, c := range cases {
			t.Run(b.Name+"/"+c.what, func(t *testing.T) {
				t.Parallel()
				faultParkLong(t, b.New(t), b.Name, c.what, c.name, c.id)
			})
		}
	}
}

func faultParkLong(t *testing.T, e *env, backend, what, name, id string) {
	t.Helper()
	ctx := context.Background()
	store, cps, lot := e.Events, e.Checkpoints, e.Parking
	ev := domain.NewEventEnvelope[any](map[string]any{}, "agg-long", "fault.long", 0)
	ev.ID = id
	require.NoError(t, store.Append(ctx, "agg-long", -1, ev))

	logger, logs := newLogger()
	sub, err := subscriptions.NewSubscriber(name, store, cps,
		func(context.Context, domain.EventEnvelope[any]) error { return errors.New("poison") },
		subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(0),
		subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(logger))
	require.NoError(t, err)
	r := start(t, sub)
	parked := false
	require.Eventually(t, func() bool {
		list, err := sub.ListParked(ctx)
		parked = err == nil && len(list) == 1
		return parked || strings.Contains(logs.String(), "parking the event failed")
	}, 30*time.Second, 10*time.Millisecond)
	r.stop(t)
	// Regression: parked_events was keyed on the columns themselves, whose
	// B-tree entry overflowed ("index row size exceeds btree maximum").
	require.True(t, parked, "a subscriber name and an event ID of %s (%d and %d bytes, both within their limits) were not parked on %s: %s",
		what, len(name), len(id), backend, faultLogError(logs.String(), "parking the event failed"))
	list, err := sub.ListParked(ctx)
	require.NoError(t, err)
	require.Equal(t, id, list[0].EventID)
	require.Equal(t, name, list[0].Subscriber)
	require.Equal(t, faultHead(t, store), faultCheckpoint(t, e.DB, name))
}

// faultLogError returns the error attribute of the first log line that
// contains msg.
func faultLogError(logs, msg string) string {
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, msg) {
			// The database's own words, without the (long) values.
			for _, marker := range []string{"index row", "ERROR:", "error="} {
				if k := strings.Index(line, marker); k >= 0 {
					return faultTruncate(line[k:], 300)
				}
			}
			return faultTruncate(line, 300)
		}
	}
	return "(not logged)"
}

// faultIncompressible returns a random valid UTF-8 string of exactly n
// bytes (random three-byte CJK characters topped up with ASCII): text no
// compressor shrinks much.
func faultIncompressible(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len()+3 <= n {
		b.WriteRune(rune(0x4E00 + rng.IntN(0x9FFF-0x4E00)))
	}
	for b.Len() < n {
		b.WriteByte(byte('a' + rng.IntN(26)))
	}
	return b.String()
}

func faultTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}

// faultMD5Collision is a pair of printable ASCII strings with the same MD5
// digest (an identical-prefix collision from HashClash's textcoll): any
// client that chooses its own event IDs or subscriber names can use it.
var faultMD5Collision = [2]string{
	"TEXTCOLLBYfGiJUETHQ4hAcKSMd5zYpgqf1YRDhkmxHkhPWptrkoyz28wnI9V0aHeAuaKnak",
	"TEXTCOLLBYfGiJUETHQ4hEcKSMd5zYpgqf1YRDhkmxHkhPWptrkoyz28wnI9V0aHeAuaKnak",
}

// TestFaultHostileCollidingDigests parks two poison events whose IDs have
// the same MD5 digest for one subscriber, and one poison event for two
// subscribers whose names have the same MD5 digest: both are distinct
// values, so each must be parked on its own row, listed, and replayable —
// a lot keyed on digests must not merge them.
func TestFaultHostileCollidingDigests(t *testing.T) {
	t.Parallel()
	require.Equal(t, md5.Sum([]byte(faultMD5Collision[0])), md5.Sum([]byte(faultMD5Collision[1])))
	require.NotEqual(t, faultMD5Collision[0], faultMD5Collision[1])
	for _, b := range dbEnvs() {
		if b.Name == "sqlite-memory" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := b.New(t)
			store, cps, lot := e.Events, e.Checkpoints, e.Parking
			for _, id := range faultMD5Collision {
				ev := domain.NewEventEnvelope[any](map[string]any{}, "agg-md5", "fault.md5", 0)
				ev.ID = id
				require.NoError(t, store.Append(ctx, "agg-md5", -1, ev))
			}
			head := faultHead(t, store)

			var fixed atomic.Bool
			var problems []string
			for n, name := range faultMD5Collision {
				sub, err := subscriptions.NewSubscriber(name, store, cps,
					func(context.Context, domain.EventEnvelope[any]) error {
						if fixed.Load() {
							return nil
						}
						return errors.New("poison")
					},
					subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(0),
					subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(quietLogger()))
				require.NoError(t, err)
				fixed.Store(false)
				r := start(t, sub)
				faultWaitCheckpointAtHead(t, e.DB, store, name, 30*time.Second)
				r.stop(t)

				parked, err := sub.ListParked(ctx)
				require.NoError(t, err)
				var ids []string
				var listed []string
				for _, p := range parked {
					require.Equal(t, name, p.Subscriber)
					ids = append(ids, p.EventID)
					listed = append(listed, fmt.Sprintf("ID #%d at position %d", slices.Index(faultMD5Collision[:], p.EventID)+1, p.Position))
				}
				if !slices.Equal(ids, faultMD5Collision[:]) {
					problems = append(problems, fmt.Sprintf("subscriber #%d (checkpoint %d of %d) lists %d parked events %v instead of IDs #1 and #2",
						n+1, faultCheckpoint(t, e.DB, name), head, len(ids), listed))
					continue
				}
				fixed.Store(true)
				for _, id := range faultMD5Collision {
					require.NoError(t, sub.ReplayParked(ctx, id))
				}
				left, err := sub.ListParked(ctx)
				require.NoError(t, err)
				require.Empty(t, left)
			}
			require.Equal(t, head, faultCheckpoint(t, e.DB, faultMD5Collision[0]))
			// Regression: on Postgres parked_events was keyed on
			// (md5(subscriber), md5(event_id)) and Park's ON CONFLICT DO
			// UPDATE merged the second event into the first one's row.
			require.Empty(t, problems, "GormParkingLot on %s merges distinct values whose MD5 digests collide, losing a parked poison event", b.Name)
		})
	}
}
