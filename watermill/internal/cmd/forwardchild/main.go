// Command forwardchild is the child process of the nested module's crash
// tests (forward_fault_test.go): one subscriber on a Postgres event store
// forwarding every event through the watermill Forwarder's batch handler,
// to NATS JetStream (natsjs.Publisher) or RabbitMQ (watermill-amqp), until
// it is SIGKILLed (the point of the tests) or asked to stop (SIGTERM).
//
// Usage:
//
//	forwardchild -dsn DSN -name SUBSCRIBER -broker nats|amqp -url URL -topic SUBJECT-PREFIX|QUEUE [-batch N] [-poll D]
//
// It prints "READY <pid>" once its subscriber is about to run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
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
	dsn := flag.String("dsn", "", "Postgres DSN")
	name := flag.String("name", "forwardchild", "subscriber name")
	broker := flag.String("broker", "nats", "nats (JetStream, natsjs) or amqp (RabbitMQ, watermill-amqp)")
	url := flag.String("url", "", "broker URL")
	topic := flag.String("topic", "", "NATS subject prefix (natsjs.SubjectPerAggregate) or AMQP queue")
	batch := flag.Int("batch", 200, "batch size")
	poll := flag.Duration("poll", 50*time.Millisecond, "poll interval")
	flag.IntVar(&killAfterAcks, "kill-after-acks", 0, "SIGKILL this process right after the Nth batch the broker acknowledged, before its checkpoint commits; 0: never")
	flag.Parse()
	if err := run(*dsn, *name, *broker, *url, *topic, *batch, *poll); err != nil {
		fmt.Fprintln(os.Stderr, "forwardchild:", err)
		os.Exit(1)
	}
}

// killAfterAcks is -kill-after-acks.
var killAfterAcks int

func run(dsn, name, broker, url, topic string, batch int, poll time.Duration) error {
	if dsn == "" || url == "" || topic == "" {
		return errors.New("-dsn, -url and -topic are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(4)
	events, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return err
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return err
	}

	var pub message.Publisher
	var topicOf forward.Option
	switch broker {
	case "nats":
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(2*time.Second),
			nats.RetryOnFailedConnect(true))
		if err != nil {
			return err
		}
		defer nc.Close()
		if pub, err = natsjs.NewPublisher(nc, natsjs.WithAckWait(2*time.Second)); err != nil {
			return err
		}
		topicOf = forward.WithTopic(natsjs.SubjectPerAggregate(topic))
	case "amqp":
		cfg := amqp.NewDurableQueueConfig(url)
		cfg.Publish.ConfirmDelivery = true
		cfg.Connection.Reconnect = &amqp.ReconnectConfig{BackoffInitialInterval: 50 * time.Millisecond, BackoffMultiplier: 2,
			BackoffMaxInterval: 500 * time.Millisecond}
		p, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
		if err != nil {
			return err
		}
		defer p.Close()
		pub = p
		topicOf = forward.WithTopic(forward.TopicConst(topic))
	default:
		return fmt.Errorf("-broker %q: nats or amqp", broker)
	}
	fwd, err := forward.New(pub, topicOf)
	if err != nil {
		return err
	}

	l, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(log), subscriptions.WithListenerReconnectDelay(100*time.Millisecond))
	if err != nil {
		return err
	}
	listenerDone := make(chan error, 1)
	go func() { listenerDone <- l.Run(ctx) }()
	handler := fwd.BatchHandler()
	acks := 0
	killing := func(ctx context.Context, evs []domain.EventEnvelope[any]) error {
		if err := handler(ctx, evs); err != nil {
			return err
		}
		if acks++; acks == killAfterAcks {
			// The broker has the batch; the checkpoint does not: the window
			// that Nats-Msg-Id deduplication covers.
			fmt.Printf("KILL after the broker acknowledged positions %d..%d\n", evs[0].Position, evs[len(evs)-1].Position)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber(name, events, checkpoints, nil,
		subscriptions.WithBatchHandler(killing),
		subscriptions.WithBatchSize(batch), subscriptions.WithPollInterval(poll),
		subscriptions.WithHandlerTimeout(30*time.Second),
		subscriptions.WithWakeSignal(l.Subscribe()), subscriptions.WithLogger(log))
	if err != nil {
		return err
	}
	fmt.Printf("READY %d\n", os.Getpid())
	runErr := sub.Run(ctx)
	stop()
	return errors.Join(runErr, <-listenerDone)
}
