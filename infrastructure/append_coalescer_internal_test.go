package infrastructure

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// doneOnceDelivered is a context cancelled at the moment its Done is
// first asked for after ready closes: so that an append's outcome and its
// cancellation are ready together when run selects between them.
type doneOnceDelivered struct {
	context.Context // cancelled
	ready           chan struct{}
}

func (c doneOnceDelivered) Done() <-chan struct{} {
	<-c.ready
	return c.Context.Done()
}

func (c doneOnceDelivered) Err() error {
	select {
	case <-c.ready:
		return c.Context.Err()
	default:
		return nil
	}
}

// TestCoalescerOutcomeBeatsCancellation: an outcome that arrived wins
// over a cancellation ready at the same time (select alone picks at
// random, and a stored append would be reported as given up).
func TestCoalescerOutcomeBeatsCancellation(t *testing.T) {
	for range 64 {
		canceled, cancel := context.WithCancel(context.Background())
		cancel()
		ctx := doneOnceDelivered{Context: canceled, ready: make(chan struct{})}
		var c appendCoalescer
		err := c.run(&appendRequest{ctx: ctx, aggregateID: "a", events: make([]domain.EventEnvelope[any], 1)}, func(b *appendBatch) {
			for _, m := range b.members {
				m.done <- nil
			}
			close(ctx.ready)
		})
		require.NoError(t, err)
	}
}
