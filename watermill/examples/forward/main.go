// Command forward appends orders to an event store, forwards them to NATS
// JetStream with the watermill Forwarder (package
// github.com/eventfeed/subscriptions/watermill, natsjs publisher) and
// prints what a JetStream consumer reads back.
//
//	cd watermill
//	go run ./examples/forward                 # embedded SQLite in a temporary directory
//	go run ./examples/forward -dsn postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	go run ./examples/forward -orders 5 -delete-stream   # removes the stream at the end
//
// It creates the stream (-stream, taking -subject.>) if it is missing,
// with a two-minute Duplicates window: a forwarder restarted within it
// sends nothing twice (docs/outbound.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	glebarez "github.com/glebarez/sqlite"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	forward "github.com/eventfeed/subscriptions/watermill"
	"github.com/eventfeed/subscriptions/watermill/natsjs"
)

func main() {
	dsn := flag.String("dsn", "", "Postgres DSN; empty: SQLite in a temporary directory")
	natsURL := flag.String("nats", "nats://127.0.0.1:4222", "NATS server")
	stream := flag.String("stream", "ORDERS", "JetStream stream")
	subject := flag.String("subject", "orders", "subject prefix: events go to <subject>.order.<order ID>")
	orders := flag.Int("orders", 3, "orders to place, each placed then paid")
	del := flag.Bool("delete-stream", false, "delete the stream at the end")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *dsn, *natsURL, *stream, *subject, *orders, *del); err != nil {
		fmt.Fprintln(os.Stderr, "forward:", err)
		os.Exit(1)
	}
}

type order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

func run(ctx context.Context, out io.Writer, dsn, natsURL, stream, subject string, orders int, del bool) error {
	// The event store: SQLite by default, Postgres with -dsn.
	var dialector gorm.Dialector
	if dsn == "" {
		dir, err := os.MkdirTemp("", "forward-example-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dialector = glebarez.Open("file:" + filepath.Join(dir, "orders.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	} else {
		dialector = postgres.Open(dsn)
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	events, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return err
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return err
	}

	// The broker: a connection that reconnects forever, the stream.
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subject + ".>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	if del {
		defer js.DeleteStream(context.Background(), stream)
	}

	// The forwarder: one message per event, on its order's subject.
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		return err
	}
	fwd, err := forward.New(pub, forward.WithTopic(natsjs.SubjectPerAggregate(subject)))
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sub, err := subscriptions.NewSubscriber("orders-to-nats", events, checkpoints, nil,
		subscriptions.WithBatchHandler(fwd.BatchHandler()), subscriptions.WithPollInterval(50*time.Millisecond),
		subscriptions.WithLogger(quiet))
	if err != nil {
		return err
	}

	// The consumer: everything in the stream from now on, printed.
	info, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: info.CachedInfo().State.LastSeq + 1,
	})
	if err != nil {
		return err
	}
	want := 2 * orders
	got := make(chan string, want)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		h := m.Headers()
		got <- fmt.Sprintf("%s %s #%s %s", h.Get(forward.MetadataEventType), h.Get(forward.MetadataAggregateID), h.Get(forward.MetadataSequenceNo), strings.TrimSpace(string(m.Data())))
	})
	if err != nil {
		return err
	}
	defer cc.Stop()

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	run := fmt.Sprintf("%d", time.Now().UnixNano()%100000)
	for i := 1; i <= orders; i++ {
		id := fmt.Sprintf("order-%s-%d", run, i)
		placed := domain.NewEventEnvelope[any](order{ID: id, Total: 10 * i}, id, "order.placed", 0)
		paid := domain.NewEventEnvelope[any](order{ID: id, Total: 10 * i}, id, "order.paid", 0)
		if err := events.Append(ctx, id, 0, placed, paid); err != nil {
			return err
		}
	}
	timeout := time.After(30 * time.Second)
	for range want {
		select {
		case line := <-got:
			fmt.Fprintln(out, line)
		case <-timeout:
			return errors.New("the consumer did not receive every event within 30s")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
