// Command crashchild is the child process of the fault suite's crash-loop
// and failover tests (fault_crash_test.go, fault_failover_test.go in the
// module root). It runs one Subscriber whose handler writes a projection
// row per event through the batch transaction (TxFromContext; with -driver
// pgx, the stores of package pgxstore and pgxstore.TxFromContext), until it is
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
//	crashchild -driver postgres|pgx|sqlite|glebarez -dsn DSN -name SUBSCRIBER [-batch N] [-poll D]
//	           [-table NAME] [-delay D] [-listen] [-partitions N -concurrency K]
//	           [-repartition N] [-kill-after K]
//	crashchild -tenant 'TENANT|DATABASE|DSN' [-tenant ...] [-workers N] -name SUBSCRIBER [-batch N] [-poll D] [-table NAME]
//	           [-partitions N -concurrency K]
//
// With -tenant (repeated) it runs a Group instead (group_servers_test.go):
// the definition SUBSCRIBER over every tenant, each a Postgres schema
// selected by its DSN, opened through GORM on a pool of its own that keeps
// no idle connection, on -workers workers, probing every -poll. The
// projection table is each tenant's. With -partitions the group runs a
// second definition, SUBSCRIBER-parts, with WithPartitions(N) and
// WithConcurrency(K), into the table NAME_parts.
//
// It prints "READY <pid>" on stdout once its subscriber is about to run.
// With -repartition N it does not run the subscriber but repartitions its
// name to N partitions (Subscriber.Repartition, whose catch-up writes the
// projection through the repartition's transaction), prints
// "REPARTITIONED" and exits; -kill-after K makes the handler SIGKILL its
// own process on its K-th call, in the middle of that catch-up.
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
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	glebarez "github.com/glebarez/sqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/sqlerr"
	"github.com/eventfeed/subscriptions/migrations/schema"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// tableName keeps the projection table a plain identifier: it is spliced
// into SQL.
var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func main() {
	driver := flag.String("driver", "postgres", "database driver: postgres (GORM), pgx (package pgxstore), sqlite (gorm.io/driver/sqlite) or glebarez (github.com/glebarez/sqlite)")
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
	flag.IntVar(&repartitionTo, "repartition", -1, "repartition the name to N partitions (0: unpartitioned) instead of running it")
	flag.Int64Var(&killAfter, "kill-after", 0, "the handler SIGKILLs its own process on its K-th call (0: never)")
	var tenants tenantFlags
	flag.Var(&tenants, "tenant", "run a Group over this tenant, 'TENANT|DATABASE|DSN' (repeated; postgres only)")
	workers := flag.Int("workers", subscriptions.DefaultGroupWorkers, "with -tenant: the group's workers")
	flag.Parse()

	if len(tenants) > 0 {
		if err := runGroup(tenants, *workers, *name, *batch, *poll, *table, *partitions, *concurrency); err != nil {
			fmt.Fprintln(os.Stderr, "crashchild:", err)
			os.Exit(1)
		}
		return
	}

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

// killOn, parkRetries, repartitionTo and killAfter are -kill-type,
// -park-retries, -repartition and -kill-after; calls counts the handler's
// calls.
var (
	killOn        string
	parkRetries   = -1
	repartitionTo = -1
	killAfter     int64
	calls         atomic.Int64
)

// pool is the connection pool's size: a partition worker each, plus the
// coordinator and a spare; idle is its SetMaxIdleConns (-1: database/sql's
// default).
var pool, idle = 4, -1

func run(driver, dsn, name string, batch int, poll time.Duration, table string, delay time.Duration, listen bool, extra ...subscriptions.SubscriberOption) error {
	if dsn == "" {
		return errors.New("-dsn is required")
	}
	if !tableName.MatchString(table) {
		return fmt.Errorf("-table %q is not a plain identifier", table)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var st *stores
	var err error
	if driver == "pgx" {
		st, err = openPgx(ctx, dsn, table)
	} else {
		st, err = openGorm(ctx, driver, dsn, table)
	}
	if err != nil {
		return err
	}
	defer st.close()

	handler := projector(table, delay, st.execInBatch)
	events, checkpoints := st.events, st.checkpoints

	opts := []subscriptions.SubscriberOption{
		subscriptions.WithBatchSize(batch),
		subscriptions.WithPollInterval(poll),
		subscriptions.WithLogger(logger),
	}
	opts = append(opts, extra...)
	if parkRetries >= 0 {
		lot, err := st.lot()
		if err != nil {
			return fmt.Errorf("parking lot: %w", err)
		}
		opts = append(opts, subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(parkRetries),
			subscriptions.WithRetryBackoff(time.Millisecond, 10*time.Millisecond))
	}
	listenerDone := make(chan error, 1)
	if listen {
		if driver != "postgres" && driver != "pgx" {
			return errors.New("-listen needs -driver postgres or pgx")
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
	fmt.Printf("READY %d\n", os.Getpid())
	if repartitionTo >= 0 {
		if err := sub.Repartition(ctx, repartitionTo); err != nil {
			return err
		}
		fmt.Println("REPARTITIONED")
		stop()
		return <-listenerDone
	}
	runErr := sub.Run(ctx)
	stop()
	return errors.Join(runErr, <-listenerDone)
}

// projector is the child's handler: it writes a projection row per event
// into table through the batch transaction (execInBatch), reports a
// unique violation as a DUPLICATE line, and SIGKILLs the process on
// -kill-type's events and -kill-after's call.
func projector(table string, delay time.Duration, execInBatch func(ctx context.Context, sql string, args ...any) error) subscriptions.Handler {
	pid := os.Getpid()
	insert := "INSERT INTO " + table + " (event_id, position, pid, handled_at) VALUES (?, ?, ?, ?)"
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		if delay > 0 {
			time.Sleep(delay)
		}
		if n := calls.Add(1); (killOn != "" && ev.EventType == killOn) || n == killAfter {
			fmt.Fprintf(os.Stderr, "KILLER event %s at position %d (call %d): killing pid %d\n", ev.ID, ev.Position, n, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			select {} // the signal ends the process
		}
		err := execInBatch(ctx, insert, ev.ID, ev.Position, pid, time.Now().UnixNano())
		if isUniqueViolation(err) {
			fmt.Fprintf(os.Stderr, "DUPLICATE event %s at position %d (pid %d): %v\n", ev.ID, ev.Position, pid, err)
		}
		return err
	}
}

// tenantFlags is the repeated -tenant flag.
type tenantFlags []subscriptions.Feed

// tenantDSNs keeps each -tenant's DSN, by tenant.
var tenantDSNs = map[string]string{}

func (f *tenantFlags) String() string { return fmt.Sprint(len(*f), " tenants") }

func (f *tenantFlags) Set(v string) error {
	parts := strings.SplitN(v, "|", 3)
	if len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return fmt.Errorf("-tenant %q: want TENANT|DATABASE|DSN", v)
	}
	*f = append(*f, subscriptions.Feed{Tenant: parts[0], Database: parts[1]})
	tenantDSNs[parts[0]] = parts[2]
	return nil
}

// runGroup runs the definition name (and, with partitions, name-parts
// partitioned) as a Group over the tenants, until SIGTERM or SIGINT.
func runGroup(tenants []subscriptions.Feed, workers int, name string, batch int, poll time.Duration, table string, partitions, concurrency int) error {
	if !tableName.MatchString(table) {
		return fmt.Errorf("-table %q is not a plain identifier", table)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Two connections a tenant at most, none kept idle (see Group): the
	// group's budget, not the pools, bounds what is open.
	pool, idle = 2, 0
	// A batch writes through the transaction of its tenant's pool: the
	// handler finds the tenant's own statement runner in its context.
	byTenant := map[string]func(ctx context.Context, sql string, args ...any) error{}
	for i, feed := range tenants {
		st, err := openGorm(ctx, "postgres", tenantDSNs[feed.Tenant], table)
		if err != nil {
			return fmt.Errorf("tenant %q: %w", feed.Tenant, err)
		}
		defer st.close()
		tenants[i].Events, tenants[i].Checkpoints = st.events, st.checkpoints
		byTenant[feed.Tenant] = st.execInBatch
	}
	exec := func(ctx context.Context, sql string, args ...any) error {
		return byTenant[subscriptions.TenantFromContext(ctx)](ctx, sql, args...)
	}
	opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(batch), subscriptions.WithPollInterval(poll)}
	defs := []subscriptions.GroupSubscriber{{Name: name, Handler: projector(table, 0, exec), Options: opts}}
	if partitions > 0 {
		defs = append(defs, subscriptions.GroupSubscriber{Name: name + "-parts", Handler: projector(table+"_parts", 0, exec),
			Options: append(slices.Clone(opts), subscriptions.WithPartitions(partitions), subscriptions.WithConcurrency(concurrency))})
	}
	g, err := subscriptions.NewGroup(defs, subscriptions.WithGroupWorkers(workers), subscriptions.WithGroupPollInterval(poll), subscriptions.WithGroupLogger(logger))
	if err != nil {
		return err
	}
	for _, feed := range tenants {
		if err := g.Add(feed); err != nil {
			return err
		}
	}
	fmt.Printf("READY %d\n", os.Getpid())
	return g.Run(ctx)
}

// stores are the child's stores on one database, and how its handler
// writes through a batch's transaction.
type stores struct {
	events      domain.EventStore
	checkpoints subscriptions.CheckpointStore
	lot         func() (subscriptions.ParkingLot, error)
	// execInBatch runs a statement (? placeholders) in the batch
	// transaction of the handler's context.
	execInBatch func(ctx context.Context, sql string, args ...any) error
	close       func()
}

// openGorm opens the GORM backend's stores.
func openGorm(ctx context.Context, driver, dsn, table string) (*stores, error) {
	var dialector gorm.Dialector
	switch driver {
	case "postgres":
		dialector = postgres.Open(dsn)
	case "sqlite":
		dialector = sqlite.Open(dsn)
	case "glebarez":
		dialector = glebarez.Open(dsn)
	default:
		return nil, fmt.Errorf("-driver %q: use postgres, pgx, sqlite (gorm.io/driver/sqlite) or glebarez (github.com/glebarez/sqlite)", driver)
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(pool)
	if idle >= 0 {
		sqlDB.SetMaxIdleConns(idle)
	}
	fail := func(what string, err error) (*stores, error) {
		_ = sqlDB.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	events, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return fail("event store", err)
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return fail("checkpoint store", err)
	}
	if err := createProjection(ctx, db, driver, table); err != nil {
		return fail("projection table", err)
	}
	return &stores{
		events:      events,
		checkpoints: checkpoints,
		lot:         func() (subscriptions.ParkingLot, error) { return subscriptions.NewGormParkingLot(db) },
		execInBatch: func(ctx context.Context, sql string, args ...any) error {
			tx := subscriptions.TxFromContext(ctx)
			if tx == nil {
				return errors.New("no batch transaction in the handler's context")
			}
			return tx.Exec(sql, args...).Error
		},
		close: func() { _ = sqlDB.Close() },
	}, nil
}

// openPgx opens package pgxstore's stores on a pgx pool.
func openPgx(ctx context.Context, dsn, table string) (*stores, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("dsn: %w", err)
	}
	cfg.MaxConns = int32(pool)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	fail := func(what string, err error) (*stores, error) {
		p.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	events, err := pgxstore.NewEventStore(ctx, p)
	if err != nil {
		return fail("event store", err)
	}
	checkpoints, err := pgxstore.NewCheckpointStore(ctx, p)
	if err != nil {
		return fail("checkpoint store", err)
	}
	ddl := "CREATE TABLE IF NOT EXISTS " + table + " (event_id text PRIMARY KEY, position bigint NOT NULL, pid bigint NOT NULL, handled_at bigint NOT NULL)"
	if err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.' || $1))", table); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, ddl)
		return err
	}); err != nil {
		return fail("projection table", err)
	}
	return &stores{
		events:      events,
		checkpoints: checkpoints,
		lot:         func() (subscriptions.ParkingLot, error) { return pgxstore.NewParkingLot(ctx, p) },
		execInBatch: func(ctx context.Context, sql string, args ...any) error {
			tx := pgxstore.TxFromContext(ctx)
			if tx == nil {
				return errors.New("no batch transaction in the handler's context")
			}
			_, err := tx.Exec(ctx, schema.Rebind(sql), args...)
			return err
		},
		close: p.Close,
	}, nil
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
