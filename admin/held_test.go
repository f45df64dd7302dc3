package admin_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// TestAdminHeldEntries: with WithOrderedParking, the page and the API
// show the entries held behind a parked event of their aggregate and what
// holds them, the status counts them, and a replay of a held entry is a
// conflict naming the head; replaying the head releases the queue.
func TestAdminHeldEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			var evs []domain.EventEnvelope[any]
			for _, typ := range []string{"order.paid", "order.shipped", "order.delivered"} {
				ev := domain.NewEventEnvelope[any](map[string]any{}, "order-1", typ, 0)
				require.NoError(t, e.Events.Append(ctx, ev.AggregateID, -1, ev))
				evs = append(evs, ev)
			}
			var failing atomic.Bool
			failing.Store(true)
			h := func(_ context.Context, ev domain.EventEnvelope[any]) error {
				if failing.Load() && ev.EventType == "order.paid" {
					return errParkPoison
				}
				return nil
			}
			sub := parkSubscriber(t, e, "admin-orders", h, subscriptions.WithMaxRetries(0), subscriptions.WithParkingLot(e.Parking),
				subscriptions.WithOrderedParking())
			r := start(t, sub)
			parkWaitParked(t, sub, 3)
			waitCaughtUp(t, sub)
			r.stop(t)
			f := &adminFixture{e: e, sub: sub}
			handler := newHandler(t, []*subscriptions.Subscriber{sub}, adminAuth)
			f.mux = http.NewServeMux()
			f.mux.Handle("/ops/", http.StripPrefix("/ops", handler))
			head, shipped := evs[0].ID, evs[1].ID

			st := decodeJSON[map[string]any](t, f.do("GET", adminPath("admin-orders"), "alice", "reader", "", nil))
			require.Equal(t, float64(3), st["parked"])
			require.Equal(t, float64(2), st["held"])
			page := decodeJSON[subscriptions.ParkedPage](t, f.do("GET", adminPath("admin-orders", "parked"), "alice", "reader", "", nil))
			require.Len(t, page.Events, 3)
			require.Empty(t, page.Events[0].HeldBy)
			require.Equal(t, head, page.Events[1].HeldBy)
			require.Equal(t, head, page.Events[2].HeldBy)

			w := f.do("GET", "/ops/?subscriber=admin-orders", "alice", "", "", nil)
			require.Equal(t, 200, w.Code)
			require.Contains(t, w.Body.String(), "(2 held)")
			require.Contains(t, w.Body.String(), `held behind <a href="./?event=`+head)
			w = f.do("GET", "/ops/?subscriber=admin-orders&event="+shipped, "alice", "", "", nil)
			require.Contains(t, w.Body.String(), "Held behind</th><td class=\"held\">"+head)

			w = f.do("POST", adminPath("admin-orders", "parked", shipped, "replay"), "alice", "", "{}", jsonCT)
			require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
			require.Contains(t, decodeJSON[map[string]string](t, w)["error"], head)

			failing.Store(false)
			w = f.do("POST", adminPath("admin-orders", "parked", head, "replay"), "alice", "", "{}", jsonCT)
			require.Equal(t, 200, w.Code, w.Body.String())
			left, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, left, "the head's replay released the queue")
		})
	}
}
