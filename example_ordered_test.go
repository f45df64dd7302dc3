package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// An order projection whose "paid" handler fails for order-1: with
// WithOrderedParking its "shipped" waits behind the parked "paid" instead
// of being applied to a row that never saw the payment, while order-2
// goes on; replaying "paid" once it is fixed replays the queue in order.
func ExampleWithOrderedParking() {
	ctx := context.Background()
	store := infrastructure.NewMemoryStore()
	for _, e := range []struct{ order, typ string }{
		{"order-1", "placed"}, {"order-2", "placed"}, {"order-1", "paid"}, {"order-2", "paid"}, {"order-1", "shipped"}, {"order-2", "shipped"},
	} {
		exCheck(store.Append(ctx, e.order, -1, domain.NewEventEnvelope[any](nil, e.order, e.typ, 0)))
	}

	var fixed atomic.Bool
	var mu sync.Mutex
	rows := map[string][]string{}
	project := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		if e.AggregateID == "order-1" && e.EventType == "paid" && !fixed.Load() {
			return errors.New("payment service unavailable")
		}
		mu.Lock()
		defer mu.Unlock()
		// Memory checkpoints deliver at least once: stay idempotent.
		if !slices.Contains(rows[e.AggregateID], e.EventType) {
			rows[e.AggregateID] = append(rows[e.AggregateID], e.EventType)
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber("orders", store, subscriptions.NewMemoryCheckpointStore(), project,
		subscriptions.WithParkingLot(subscriptions.NewMemoryParkingLot()),
		subscriptions.WithOrderedParking(),
		subscriptions.WithMaxRetries(0),
		subscriptions.WithLogger(exQuietLogger()),
	)
	exCheck(err)
	stop := exStart(sub)
	exWaitCaughtUp(sub)
	stop()

	parked, err := sub.ListParked(ctx)
	exCheck(err)
	types := map[string]string{parked[0].EventID: parked[0].EventType}
	for _, p := range parked {
		if p.HeldBy != "" {
			fmt.Printf("parked: %s %s, held behind %s\n", p.AggregateID, p.EventType, types[p.HeldBy])
		} else {
			fmt.Printf("parked: %s %s: %s\n", p.AggregateID, p.EventType, p.Error)
		}
	}
	fmt.Println("order-1:", rows["order-1"], "order-2:", rows["order-2"])
	err = sub.ReplayParked(ctx, parked[1].EventID)
	fmt.Println("replay shipped first:", errors.Is(err, subscriptions.ErrParkedBehindHead))

	fixed.Store(true)
	exCheck(sub.ReplayParked(ctx, parked[0].EventID))
	fmt.Println("order-1:", rows["order-1"])
	// Output:
	// parked: order-1 paid: payment service unavailable
	// parked: order-1 shipped, held behind paid
	// order-1: [placed] order-2: [placed paid shipped]
	// replay shipped first: true
	// order-1: [placed paid shipped]
}
