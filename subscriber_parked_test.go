package subscriptions_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// TestManageParked runs the Subscriber's parked-event management on every
// backend: a running subscriber parks events with their aggregate ID;
// paging; bulk replay in position order, stopping at the first failure or
// continuing; a discard that leaves an audit line.
func TestManageParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			// Six poison events over three aggregates, two types.
			var poison []domain.EventEnvelope[any]
			for i := range 6 {
				typ := []string{"manage.a", "manage.b"}[i%2]
				ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, []string{"acc-1", "acc-2", "acc-3"}[i%3], typ, 0)
				require.NoError(t, e.Events.Append(ctx, ev.AggregateID, -1, ev))
				stored, err := e.Events.GetEventByID(ctx, ev.ID)
				require.NoError(t, err)
				poison = append(poison, stored)
			}
			var (
				mu      sync.Mutex
				failing = map[string]bool{}
				order   []string
			)
			for _, ev := range poison {
				failing[ev.ID] = true
			}
			h := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				mu.Lock()
				defer mu.Unlock()
				if failing[ev.ID] {
					return errParkPoison
				}
				order = append(order, ev.ID)
				return nil
			}
			logger, logs := newLogger()
			sub := parkSubscriber(t, e, "manage", h, subscriptions.WithMaxRetries(0),
				subscriptions.WithParkingLot(e.Parking), subscriptions.WithLogger(logger))
			r := start(t, sub)
			parkWaitParked(t, sub, len(poison))
			waitCaughtUp(t, sub)
			r.stop(t)
			setFailing := func(f func(i int) bool) {
				mu.Lock()
				defer mu.Unlock()
				for i, ev := range poison {
					failing[ev.ID] = f(i)
				}
				order = nil
			}
			replayedOrder := func() []string {
				mu.Lock()
				defer mu.Unlock()
				return append([]string{}, order...)
			}

			t.Run("parked with aggregate ID", func(t *testing.T) {
				for _, ev := range poison {
					p, err := sub.GetParked(ctx, ev.ID)
					require.NoError(t, err)
					require.Equal(t, ev.AggregateID, p.AggregateID)
					require.Equal(t, ev.Position, p.Position)
				}
				_, err := sub.GetParked(ctx, "manage-none")
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
			})

			t.Run("pages", func(t *testing.T) {
				page, err := sub.ListParkedPage(ctx, subscriptions.ParkedFilter{Limit: 4})
				require.NoError(t, err)
				require.Len(t, page.Events, 4)
				require.True(t, page.More)
				require.Equal(t, poison[3].Position, page.NextAfter)
				page, err = sub.ListParkedPage(ctx, subscriptions.ParkedFilter{Limit: 4, AfterPosition: page.NextAfter})
				require.NoError(t, err)
				require.Equal(t, []string{poison[4].ID, poison[5].ID}, parkedIDs(page.Events))
				require.False(t, page.More)
				page, err = sub.ListParkedPage(ctx, subscriptions.ParkedFilter{Limit: 2, AggregateID: "acc-1"})
				require.NoError(t, err)
				require.Equal(t, []string{poison[0].ID, poison[3].ID}, parkedIDs(page.Events))
				require.False(t, page.More, "exactly a full page is the last one")
				page, err = sub.ListParkedPage(ctx, subscriptions.ParkedFilter{Limit: math.MaxInt})
				require.NoError(t, err)
				require.Len(t, page.Events, len(poison), "the largest limit does not overflow")
				require.False(t, page.More)
			})

			t.Run("replay matching stops at the first failure", func(t *testing.T) {
				// Type manage.a: poison 0, 2, 4; 2 still fails.
				setFailing(func(i int) bool { return i == 2 || i%2 == 1 })
				res, err := sub.ReplayParkedMatching(ctx, subscriptions.ParkedFilter{EventType: "manage.a"}, false)
				require.ErrorIs(t, err, errParkPoison)
				require.Equal(t, []string{poison[0].ID}, res.Replayed)
				require.Len(t, res.Failed, 1)
				require.Equal(t, poison[2].ID, res.Failed[0].EventID)
				require.Equal(t, []string{poison[0].ID}, replayedOrder(), "poison 4 was not tried")
				p, err := sub.GetParked(ctx, poison[2].ID)
				require.NoError(t, err)
				require.Equal(t, 2, p.Attempts, "the failed replay is recorded on the entry")
				require.Contains(t, p.Error, errParkPoison.Error())
			})

			t.Run("replay matching continues past failures", func(t *testing.T) {
				setFailing(func(i int) bool { return i == 1 || i == 2 })
				res, err := sub.ReplayParkedMatching(ctx, subscriptions.ParkedFilter{}, true)
				require.ErrorIs(t, err, errParkPoison)
				require.Equal(t, []string{poison[3].ID, poison[4].ID, poison[5].ID}, res.Replayed)
				require.Equal(t, []string{poison[3].ID, poison[4].ID, poison[5].ID}, replayedOrder(), "replayed in position order")
				require.Len(t, res.Failed, 2)
				left, err := sub.ListParked(ctx)
				require.NoError(t, err)
				require.Equal(t, []string{poison[1].ID, poison[2].ID}, parkedIDs(left))
			})

			t.Run("discard leaves an audit line", func(t *testing.T) {
				p, err := sub.DiscardParked(ctx, poison[1].ID, "alice@example.test")
				require.NoError(t, err)
				require.Equal(t, poison[1].ID, p.EventID)
				out := logs.String()
				require.Contains(t, out, "parked event discarded")
				require.Contains(t, out, "by=alice@example.test")
				require.Contains(t, out, "event_id="+poison[1].ID)
				_, err = sub.DiscardParked(ctx, poison[1].ID, "alice@example.test")
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
				left, err := sub.ListParked(ctx)
				require.NoError(t, err)
				require.Equal(t, []string{poison[2].ID}, parkedIDs(left))
			})
		})
	}
}

// TestManageParkedNeedsManagedLot: a lot that only implements ParkingLot
// is refused by the management methods, which say why.
func TestManageParkedNeedsManagedLot(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	sub := parkSubscriber(t, e, "manage-plain", func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithParkingLot(plainLot{subscriptions.NewMemoryParkingLot()}))
	ctx := context.Background()
	_, err := sub.GetParked(ctx, "x")
	require.ErrorIs(t, err, subscriptions.ErrParkingLotNotManaged)
	_, err = sub.ListParkedPage(ctx, subscriptions.ParkedFilter{})
	require.ErrorIs(t, err, subscriptions.ErrParkingLotNotManaged)
	_, err = sub.DiscardParked(ctx, "x", "me")
	require.ErrorIs(t, err, subscriptions.ErrParkingLotNotManaged)
	_, err = sub.ReplayParkedMatching(ctx, subscriptions.ParkedFilter{}, true)
	require.ErrorIs(t, err, subscriptions.ErrParkingLotNotManaged)
	none := parkSubscriber(t, e, "manage-none", func(context.Context, domain.EventEnvelope[any]) error { return nil })
	_, err = none.GetParked(ctx, "x")
	require.True(t, errors.Is(err, subscriptions.ErrNoParkingLot))
}

// plainLot hides every method but ParkingLot's.
type plainLot struct{ subscriptions.ParkingLot }

func parkedIDs(ps []subscriptions.ParkedEvent) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.EventID)
	}
	return out
}

// TestDiscardParkedDuringReplay: a discard never removes an entry from
// under a running replay: DiscardParked answers ErrReplayInProgress at
// once on every backend, and the replay then clears the entry.
func TestDiscardParkedDuringReplay(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ev := parkStoredEvent(t, e)
			gate := newParkGate()
			sub := parkSubscriber(t, e, "park-discard-race", gate.handler, subscriptions.WithParkingLot(e.Parking))
			require.NoError(t, e.Parking.Park(context.Background(), parkEntry("park-discard-race", ev.ID, ev.Position)))
			parkPastEvent(t, e, "park-discard-race", ev)
			ctx := context.Background()

			replay := parkAsync(func() error { return sub.ReplayParked(ctx, ev.ID) })
			gate.waitEntered(t)
			discard := parkAsync(func() error { _, err := sub.DiscardParked(ctx, ev.ID, "op"); return err })
			err := parkResult(t, discard)
			close(gate.release)
			require.ErrorIs(t, err, subscriptions.ErrReplayInProgress)
			require.NoError(t, parkResult(t, replay))
			left, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, left)
		})
	}
}
