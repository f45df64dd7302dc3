package subscriptions_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sync"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// One PostgresListener per process serves every subscriber in it: each
// subscriber gets its own Subscribe() channel. The GormEventStore NOTIFYs on
// every commit, from whichever process appends, so subscribers wake within
// milliseconds; the poll interval is only the fallback for when the
// listener's connection is down.
func ExamplePostgresListener() {
	dsn := "postgres://app@db.internal:5432/app?sslmode=disable"
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	events, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		log.Fatal(err)
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		log.Fatal(err)
	}
	listener, err := subscriptions.NewPostgresListener(dsn)
	if err != nil {
		log.Fatal(err) // a malformed DSN; a server that is down is retried by Run
	}

	project := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		// Write through the batch transaction: exactly-once with the checkpoint.
		return subscriptions.TxFromContext(ctx).Exec("INSERT INTO order_totals ...").Error
	}
	notifyShipping := func(ctx context.Context, ev domain.EventEnvelope[any]) error { return nil }

	var subs []*subscriptions.Subscriber
	for name, handler := range map[string]subscriptions.Handler{"order-totals": project, "shipping": notifyShipping} {
		sub, err := subscriptions.NewSubscriber(name, events, checkpoints, handler,
			subscriptions.WithWakeSignal(listener.Subscribe()), // its own channel
			subscriptions.WithPollInterval(30*time.Second))
		if err != nil {
			log.Fatal(err)
		}
		subs = append(subs, sub)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // in a real program: on SIGTERM
	var wg sync.WaitGroup
	wg.Go(func() { _ = listener.Run(ctx) }) // returns nil once ctx is cancelled
	for _, sub := range subs {
		wg.Go(func() {
			if err := sub.Run(ctx); err != nil {
				log.Printf("subscriber %s: %v", sub.Name(), err)
			}
		})
	}
	wg.Wait()
}

// In a single process (the memory store, or SQLite), wrap the event store in
// a NotifyingEventStore so that every successful Append wakes the
// subscribers through an InProcessNotifier.
func ExampleInProcessNotifier() {
	notifier := subscriptions.NewInProcessNotifier()
	store := subscriptions.NewNotifyingEventStore(infrastructure.NewMemoryStore(), notifier.Notify)

	handled := make(chan struct{})
	sub, err := subscriptions.NewSubscriber("printer", store, subscriptions.NewMemoryCheckpointStore(),
		func(ctx context.Context, ev domain.EventEnvelope[any]) error {
			fmt.Printf("%s at position %d: %v\n", ev.EventType, ev.Position, ev.Payload)
			close(handled)
			return nil
		},
		subscriptions.WithWakeSignal(notifier.Subscribe()),
		subscriptions.WithPollInterval(time.Hour), // the wake signal, not the poll, delivers the event
		subscriptions.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()

	ev := domain.NewEventEnvelope[any](map[string]any{"order": "A-1"}, "order-A-1", "order.placed", 0)
	if err := store.Append(ctx, ev.AggregateID, 0, ev); err != nil {
		log.Fatal(err)
	}
	<-handled
	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// order.placed at position 1: map[order:A-1]
}
