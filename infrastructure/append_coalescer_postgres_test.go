package infrastructure_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
)

// TestPostgresAppendsWaitingForTheLockShareOneTransaction holds the append
// lock (an append held at the gate) with a second append queued on it in
// the database, lets appends gather behind them, and releases the lock:
// the appends that waited together commit in one transaction, each with
// its own outcome, and the feed gets every accepted event once, each
// append's events contiguous.
func TestPostgresAppendsWaitingForTheLockShareOneTransaction(t *testing.T) {
	cases := []struct {
		name string
		// refuse makes the database refuse two appends' rows at insert,
		// after every check passed: a trigger, and a stored event ID.
		refuse bool
	}{
		{name: "checks fail per append"},
		{name: "the database refuses one append's rows", refuse: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			pg := dbtest.NewPostgres(t)
			store := newGormStore(t, pg.DB)
			stored := newEvent("co-stored", "x", "stored")
			taken := newEvent("co-taken", "x", "taken")
			require.NoError(t, store.Append(ctx, "co-stored", 0, stored))
			require.NoError(t, store.Append(ctx, "co-taken", 0, taken))
			observer := pgfeed.Connect(t, pg.DSN)
			if c.refuse {
				_, err := observer.Exec(ctx, `CREATE FUNCTION refuse_append() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN RAISE EXCEPTION 'refused by test trigger'; END $$`)
				require.NoError(t, err)
				_, err = observer.Exec(ctx, `CREATE TRIGGER refuse_append BEFORE INSERT ON events FOR EACH ROW
					WHEN (NEW.aggregate_id = 'co-refused') EXECUTE FUNCTION refuse_append()`)
				require.NoError(t, err)
			}
			gate := pgfeed.NewGate(t, pg)
			doneHeld := feedtest.Async(func() error { return store.Append(ctx, "held", 0, newEvent("held", "x", nil)) })
			gate.WaitHeld(t, 1)
			doneQueued := feedtest.Async(func() error { return store.Append(ctx, "queued", 0, newEvent("queued", "x", nil)) })
			pgfeed.WaitForLockWaiters(t, observer, pgfeed.AppendLockKey(t, observer), 1, "the queued append")

			stolen := taken // its ID, under another aggregate
			stolen.AggregateID = ""
			type call struct {
				aggregate string
				expected  int
				events    []domain.EventEnvelope[any]
				want      error // nil: stored
				cancel    bool
			}
			calls := []call{
				{aggregate: "co-ok-1", expected: 0},
				{aggregate: "co-conflict", expected: 3, want: domain.ErrConcurrencyConflict},
				{aggregate: "co-ok-2", expected: -1},
				{aggregate: "co-stored", expected: 0, events: []domain.EventEnvelope[any]{stored}, want: domain.ErrAlreadyAppended},
				{aggregate: "co-canceled", expected: 0, want: context.Canceled, cancel: true},
				{aggregate: "co-ok-3", expected: 0},
				// Refused before the batch is sent: no version fits the
				// sequence numbers. Answered however the transaction ends.
				{aggregate: "co-gap", expected: 0, events: withSeqs("co-gap", 1, 3), want: domain.ErrInvalidEvent},
				{aggregate: "co-behind", expected: 2, events: withSeqs("co-behind", 1, 2), want: domain.ErrConcurrencyConflict},
			}
			if c.refuse {
				// A stored event ID under another aggregate passes every
				// check but the primary key's.
				calls = append(calls, call{aggregate: "co-refused", expected: 0, want: errRefused},
					call{aggregate: "co-stolen", expected: 0, events: []domain.EventEnvelope[any]{stolen}, want: domain.ErrInvalidEvent})
			}
			cancelCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make([]chan error, len(calls))
			for i := range calls {
				if calls[i].events == nil {
					calls[i].events = []domain.EventEnvelope[any]{
						newEvent(calls[i].aggregate, "x", i), newEvent(calls[i].aggregate, "y", i),
					}
				}
				cl := calls[i]
				actx := ctx
				if cl.cancel {
					actx = cancelCtx
				}
				done[i] = feedtest.Async(func() error { return store.Append(actx, cl.aggregate, cl.expected, cl.events...) })
			}
			eventually(t, "every append joins the batch forming behind the two in flight", func() bool {
				return infrastructure.FormingAppends(store) == len(calls)
			})
			require.Equal(t, 1, pgfeed.AdvisoryLocks(t, observer, pgfeed.AppendLockKey(t, observer), false), "only the queued append waits in the database")
			cancel()
			for i, cl := range calls {
				if cl.cancel {
					require.ErrorIs(t, feedtest.Result(t, done[i], cl.aggregate), context.Canceled)
				}
			}
			require.Equal(t, len(calls)-1, infrastructure.FormingAppends(store), "the canceled append left the batch")

			gate.Release()
			require.NoError(t, feedtest.Result(t, doneHeld, "held append"))
			require.NoError(t, feedtest.Result(t, doneQueued, "queued append"))
			var okIDs []string
			for i, cl := range calls {
				var err error
				if !cl.cancel { // its result was taken above
					err = feedtest.Result(t, done[i], cl.aggregate)
				}
				switch {
				case cl.cancel:
				case cl.want == nil:
					require.NoError(t, err, cl.aggregate)
					okIDs = append(okIDs, ids(cl.events)...)
				case cl.want == errRefused:
					require.ErrorContains(t, err, "refused by test trigger")
					require.ErrorContains(t, err, cl.aggregate)
				default:
					require.ErrorIs(t, err, cl.want, cl.aggregate)
					require.Contains(t, err.Error(), cl.aggregate)
				}
				if cl.want != nil && cl.want != domain.ErrAlreadyAppended {
					version, err := store.GetCurrentVersion(ctx, cl.aggregate)
					require.NoError(t, err)
					require.Zero(t, version, "%s: nothing stored", cl.aggregate)
				}
			}

			feed, err := store.ReadAfter(ctx, 2, 0) // past the stored events
			require.NoError(t, err)
			requireStrictlyIncreasing(t, feed)
			var batched []string
			last := map[string]int64{}
			for _, e := range feed {
				if e.AggregateID == "held" || e.AggregateID == "queued" {
					continue
				}
				batched = append(batched, e.ID)
				if p, ok := last[e.AggregateID]; ok {
					require.Equal(t, p+1, e.Position, "an append's events are contiguous")
				}
				last[e.AggregateID] = e.Position
			}
			require.ElementsMatch(t, okIDs, batched, "every accepted event once")

			var transactions int
			require.NoError(t, observer.QueryRow(ctx, `SELECT COUNT(DISTINCT xmin::text) FROM events WHERE aggregate_id LIKE 'co-ok-%'`).Scan(&transactions))
			if c.refuse {
				// Refused rows abort the shared transaction; the others are
				// then appended one by one.
				require.Equal(t, 3, transactions)
			} else {
				require.Equal(t, 1, transactions, "the appends that waited together committed together")
			}
		})
	}
}

// errRefused marks the call the test trigger refuses.
var errRefused = errors.New("refused")

// withSeqs is one event per sequence number, for aggregate.
func withSeqs(aggregate string, seqs ...int) []domain.EventEnvelope[any] {
	out := make([]domain.EventEnvelope[any], len(seqs))
	for i, seq := range seqs {
		out[i] = newEvent(aggregate, "x", i)
		out[i].SequenceNo = seq
	}
	return out
}

// TestPostgresAppendKeepsNoReferenceToTheEvents gives up on an append that
// shares a transaction held mid-way (at the gate) with another, then
// changes its payload: the batch, which goes on for the other append and
// then explains the one that gave up (a stale retry), reads only what
// Append encoded before it returned: the payload is encoded once, by
// Append. (The race detector cannot tell: it takes the database round
// trips for synchronisation.)
func TestPostgresAppendKeepsNoReferenceToTheEvents(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	store := newGormStore(t, pg.DB)
	payload := &countedPayload{}
	retried := newEvent("co-retried", "x", payload)
	require.NoError(t, store.Append(ctx, "co-retried", 0, retried))
	require.NoError(t, store.Append(ctx, "co-retried", 1, newEvent("co-retried", "y", nil)))
	observer := pgfeed.Connect(t, pg.DSN)
	key := pgfeed.AppendLockKey(t, observer)
	gate := pgfeed.NewGate(t, pg)
	// Two appends in flight, queued on the append lock the observer holds.
	_, err := observer.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	doneFirst := feedtest.Async(func() error { return store.Append(ctx, "first", 0, newEvent("first", "x", nil)) })
	doneSecond := feedtest.Async(func() error { return store.Append(ctx, "second", 0, newEvent("second", "x", nil)) })
	pgfeed.WaitForLockWaiters(t, observer, key, 2, "the two appends in flight")
	// Behind them, one batch: an append held at the gate, then the retry.
	doneHeld := feedtest.Async(func() error { return store.Append(ctx, "held", 0, newEvent("held", "x", nil)) })
	eventually(t, "the held append forms a batch", func() bool { return infrastructure.FormingAppends(store) == 1 })
	encoded := payload.calls.Load()
	giveUp, cancel := context.WithCancel(ctx)
	defer cancel()
	doneRetry := feedtest.Async(func() error { return store.Append(giveUp, "co-retried", 0, retried) })
	eventually(t, "the retry joins it", func() bool { return infrastructure.FormingAppends(store) == 2 })
	_, err = observer.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	require.NoError(t, err)
	require.NoError(t, feedtest.Result(t, doneFirst, "first"))
	require.NoError(t, feedtest.Result(t, doneSecond, "second"))
	gate.WaitHeld(t, 1)

	cancel()
	err = feedtest.Result(t, doneRetry, "the retry that gave up")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "may still succeed")
	gate.Release()
	require.NoError(t, feedtest.Result(t, doneHeld, "held")) // the batch ended
	require.Equal(t, encoded+1, payload.calls.Load(), "the payload was encoded once, in Append")
	version, err := store.GetCurrentVersion(ctx, "co-retried")
	require.NoError(t, err)
	require.Equal(t, 2, version)
}

// countedPayload counts its encodings.
type countedPayload struct{ calls atomic.Int32 }

func (p *countedPayload) MarshalJSON() ([]byte, error) {
	p.calls.Add(1)
	return []byte(`{"amount": 1}`), nil
}

// TestPostgresAppendsInFlightFollowOtherStores: a store keeps one append
// transaction in flight once another store (its own pool: another
// process) appended between two of its batches, so that its next append
// forms a batch behind the one in flight instead of queuing on the lock in
// the database; and two again once its batches follow one another. The
// feed is the same either way.
func TestPostgresAppendsInFlightFollowOtherStores(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	store := newGormStore(t, pg.DB)
	other := newGormStore(t, pg.Open(t))
	observer := pgfeed.Connect(t, pg.DSN)
	key := pgfeed.AppendLockKey(t, observer)
	var want []string
	appendTo := func(s *infrastructure.GormEventStore, agg string) {
		ev := newEvent(agg, "x", nil)
		require.NoError(t, s.Append(ctx, agg, 0, ev))
		want = append(want, ev.ID)
	}
	appendTo(store, "mine-1")
	appendTo(store, "mine-2")
	require.Equal(t, 2, infrastructure.AppendsInFlightLimit(store), "its batches follow one another")
	appendTo(other, "theirs")
	appendTo(store, "mine-3")
	require.Equal(t, 1, infrastructure.AppendsInFlightLimit(store), "another store appended between its batches")

	gate := pgfeed.NewGate(t, pg)
	held, next := newEvent("held", "x", nil), newEvent("mine-4", "x", nil)
	doneHeld := feedtest.Async(func() error { return store.Append(ctx, "held", 0, held) })
	gate.WaitHeld(t, 1)
	doneNext := feedtest.Async(func() error { return store.Append(ctx, "mine-4", 0, next) })
	eventually(t, "the next append forms a batch behind the one in flight", func() bool {
		return infrastructure.FormingAppends(store) == 1
	})
	require.Zero(t, pgfeed.AdvisoryLocks(t, observer, key, false), "nothing queued on the append lock in the database")
	gate.Release()
	require.NoError(t, feedtest.Result(t, doneHeld, "held"))
	require.NoError(t, feedtest.Result(t, doneNext, "mine-4"))
	want = append(want, held.ID, next.ID)
	// The slot that sent mine-4's batch is freed (and the store no longer
	// counted as crowded) just after the batch answered its members.
	eventually(t, "its batches followed one another again: two in flight", func() bool {
		return infrastructure.AppendsInFlightLimit(store) == 2
	})

	feed, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, want, ids(feed), "each append stored once, in order")
}
