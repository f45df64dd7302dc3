// Command crashchild is the child process of the fault suite's crash-loop
// and failover tests (fault_crash_test.go, fault_failover_test.go in the
// module root). It runs one Subscriber whose handler writes a projection
// row per event through the batch transaction (TxFromContext), until it is
// killed (SIGKILL, the point of the tests) or asked to stop (SIGTERM or
// SIGINT, which drains the batch in flight and exits 0).
//
// The projection table (event_id primary key, position, the writing
// process's pid and the handling time in Unix nanoseconds) is created
// idempotently at startup, so any number of children may start at once.
// A unique violation on it means an event was committed twice: the child
// reports it on stderr as a line starting with "DUPLICATE", which the
// parent looks for.
//
// Usage:
//
//	crashchild -driver postgres|sqlite -dsn DSN -name SUBSCRIBER [-batch N] [-poll D]
//	           [-table NAME] [-delay D] [-listen] [-partitions N -concurrency K]
//
// It prints "READY <pid>" on stdout once its subscriber is about to run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	glebarez "github.com/glebarez/sqlite"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/sqlerr"
)

// tableName keeps the projection table a plain identifier: it is spliced
// into SQL.
var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func main() {
	driver := flag.String("driver", "postgres", "database driver: postgres, sqlite (gorm.io/driver/sqlite) or glebarez (github.com/glebarez/sqlite)")
	dsn := flag.String("dsn", "", "database DSN")
	name := flag.String("name", "crashchild", "subscriber name")
	batch := flag.Int("batch", 10, "batch size")
	poll := flag.Duration("poll", 100*time.Millisecond, "poll interval")
	table := flag.String("table", "fault_projection", "projection table")
	delay := flag.Duration("delay", 0, "extra time the handler takes per event")
	listen := flag.Bool("listen", false, "wake on Postgres NOTIFY through a PostgresListener (postgres only)")
	partitions := flag.Int("partitions", 0, "WithPartitions(N); 0: unpartitioned")
	concurrency := flag.Int("concurrency", 1, "WithConcurrency(K), with -partitions")
	killType := flag.String("kill-type", "", "the handler SIGKILLs its own process on an event of this type")
	retries := flag.Int("park-retries", -1, "with a GORM parking lot and WithMaxRetries(N); -1: no parking lot")
	flag.Parse()

	var extra []subscriptions.SubscriberOption
	if *partitions > 0 {
		extra = append(extra, subscriptions.WithPartitions(*partitions), subscriptions.WithConcurrency(*concurrency))
		pool = *concurrency + 3
	}
	killOn, parkRetries = *killType, *retries
	if err := run(*driver, *dsn, *name, *batch, *poll, *table, *delay, *listen, extra...); err != nil {
		fmt.Fprintln(os.Stderr, "crashchild:", err)
		os.Exit(1)
	}
}

// killOn and parkRetries are -kill-type and -park-retries.
var (
	killOn      string
	parkRetries = -1
)

// pool is the connection pool's size: a partition worker each, plus the
// coordinator and a spare.
var pool = 4

func run(driver, dsn, name string, batch int, poll time.Duration, table string, delay time.Duration, listen bool, extra ...subscriptions.SubscriberOption) error {
	if dsn == "" {
		return errors.New("-dsn is required")
	}
	if !tableName.MatchString(table) {
		return fmt.Errorf("-table %q is not a plain identifier", table)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var dialector gorm.Dialector
	switch driver {
	case "postgres":
		dialector = postgres.Open(dsn)
	case "sqlite":
		dialector = sqlite.Open(dsn)
	case "glebarez":
		dialector = glebarez.Open(dsn)
	default:
		return fmt.Errorf("-driver %q: use postgres, sqlite (gorm.io/driver/sqlite) or glebarez (github.com/glebarez/sqlite)", driver)
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(pool)

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	events, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return fmt.Errorf("event store: %w", err)
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return fmt.Errorf("checkpoint store: %w", err)
	}
	if err := createProjection(ctx, db, driver, table); err != nil {
		return fmt.Errorf("projection table: %w", err)
	}

	pid := os.Getpid()
	insert := "INSERT INTO " + table + " (event_id, position, pid, handled_at) VALUES (?, ?, ?, ?)"
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tx := subscriptions.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no batch transaction in the handler's context")
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		if killOn != "" && ev.EventType == killOn {
			fmt.Fprintf(os.Stderr, "KILLER event %s at position %d: killing pid %d\n", ev.ID, ev.Position, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			select {} // the signal ends the process
		}
		err := tx.Exec(insert, ev.ID, ev.Position, pid, time.Now().UnixNano()).Error
		if isUniqueViolation(err) {
			fmt.Fprintf(os.Stderr, "DUPLICATE event %s at position %d (pid %d): %v\n", ev.ID, ev.Position, pid, err)
		}
		return err
	}

	opts := []subscriptions.SubscriberOption{
		subscriptions.WithBatchSize(batch),
		subscriptions.WithPollInterval(poll),
		subscriptions.WithLogger(logger),
	}
	opts = append(opts, extra...)
	if parkRetries >= 0 {
		lot, err := subscriptions.NewGormParkingLot(db)
		if err != nil {
			return fmt.Errorf("parking lot: %w", err)
		}
		opts = append(opts, subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(parkRetries),
			subscriptions.WithRetryBackoff(time.Millisecond, 10*time.Millisecond))
	}
	listenerDone := make(chan error, 1)
	if listen {
		if driver != "postgres" {
			return errors.New("-listen needs -driver postgres")
		}
		l, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(logger),
			subscriptions.WithListenerReconnectDelay(100*time.Millisecond))
		if err != nil {
			return err
		}
		opts = append(opts, subscriptions.WithWakeSignal(l.Subscribe()))
		go func() { listenerDone <- l.Run(ctx) }()
	} else {
		listenerDone <- nil
	}
	sub, err := subscriptions.NewSubscriber(name, events, checkpoints, handler, opts...)
	if err != nil {
		return err
	}
	fmt.Printf("READY %d\n", pid)
	runErr := sub.Run(ctx)
	stop()
	return errors.Join(runErr, <-listenerDone)
}

// createProjection creates the projection table unless it exists. On
// Postgres concurrent CREATE TABLE IF NOT EXISTS can still collide in the
// catalog, so the statement runs under an advisory lock.
func createProjection(ctx context.Context, db *gorm.DB, driver, table string) error {
	ddl := "CREATE TABLE IF NOT EXISTS " + table + " (event_id text PRIMARY KEY, position bigint NOT NULL, pid bigint NOT NULL, handled_at bigint NOT NULL)"
	if driver != "postgres" {
		return db.WithContext(ctx).Exec(ddl).Error
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.' || ?))", table).Error; err != nil {
			return err
		}
		return tx.Exec(ddl).Error
	})
}

func isUniqueViolation(err error) bool {
	_, unique := sqlerr.UniqueViolation(err)
	return unique
}
