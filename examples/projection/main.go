// Command projection is the first-run example of package subscriptions: a
// background subscriber that keeps an account-balance projection up to
// date from an event store, survives a poison event, and replays it once
// the handler is fixed.
//
//	go run ./examples/projection                       # embedded SQLite, nothing to install
//	go run ./examples/projection -replicas 3           # three subscribers with one name
//	go run ./examples/projection -postgres 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go run ./examples/projection -admin 127.0.0.1:8080  # then open http://127.0.0.1:8080/admin/
//
// With -admin the example stops after step 4's "fix" and serves the admin
// page (admin.NewHandler, mounted under /admin/) until
// Ctrl-C, leaving the parked event for you to replay or discard there;
// the database stays until then, so cmd/subscriptions can be pointed at it.
//
// What it does, on either database:
//
//  1. opens the database: by default a SQLite file in a new temporary
//     directory (removed at exit); with -postgres, a new schema on that
//     server (its own tables only, dropped at exit — the program never
//     reads or writes any other schema);
//  2. starts the subscriber(s): the handler is a domain.EventDispatcher
//     with typed handlers (domain.Subscribe) that write a balances table
//     through the batch transaction (subscriptions.TxFromContext), so each
//     event's effect commits together with the checkpoint advance;
//  3. appends events for three accounts through infrastructure.GormEventStore
//     — one withdrawal overdraws its account and the handler, deliberately
//     buggy, refuses it: after a few quick retries the event is parked and
//     the events behind it keep flowing;
//  4. waits until the subscriber has caught up (lag 0), prints the parked
//     event and the projection, "fixes" the handler, replays the parked
//     event with Subscriber.ReplayParked and prints them again;
//  5. checks that every event was handled exactly once, across replicas;
//  6. rebuilds the projection blue/green (bluegreen.go): a new version,
//     "balances/v2", fills its own table while "balances" keeps serving
//     the readers' view and events keep arriving; once it has caught up
//     the view is switched in one transaction and the old name retired;
//     then it prints a summary.
//
// Wake-ups: on SQLite the store is wrapped in a NotifyingEventStore that
// signals an InProcessNotifier; on Postgres a PostgresListener LISTENs for
// the NOTIFY the store sends on every commit. Either way polling remains
// the fallback.
//
// With -replicas N, N subscribers run with the same name. On Postgres each
// has its own connection pool, event store, checkpoint store, parking lot
// and listener, exactly as N processes would; on SQLite (one process) they
// share the database handle. The checkpoint store lets one of them process
// each batch.
//
// Exit status: 0 on success, 1 on any failure (a bad DSN, an unreachable
// server, a subscriber that does not catch up, an event handled other than
// once), 2 for bad flags. Messages never contain the DSN's password.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dsn"
	"github.com/eventfeed/subscriptions/internal/secret"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// The events of the example. Payloads are plain structs: the GORM store
// keeps them as JSON and domain.Subscribe decodes them back into these
// types for the typed handlers.
type (
	AccountOpened  struct{ Owner string }
	MoneyDeposited struct{ Amount int64 }
	MoneyWithdrawn struct{ Amount int64 }
)

const (
	subscriberName = "balances"

	typeOpened    = "account.opened"
	typeDeposited = "account.deposited"
	typeWithdrawn = "account.withdrawn"

	maxReplicas = 16
)

// script is what the example appends, one Append per line, in this order:
// the accounts' events interleave in the global feed. Bob's withdrawal of
// 60 from a balance of 40 is the event the buggy handler refuses.
var script = []struct {
	account string
	event   string
	payload any
}{
	{"acc-1", typeOpened, AccountOpened{Owner: "Alice"}},
	{"acc-2", typeOpened, AccountOpened{Owner: "Bob"}},
	{"acc-3", typeOpened, AccountOpened{Owner: "Carol"}},
	{"acc-1", typeDeposited, MoneyDeposited{Amount: 100}},
	{"acc-2", typeDeposited, MoneyDeposited{Amount: 40}},
	{"acc-3", typeDeposited, MoneyDeposited{Amount: 500}},
	{"acc-1", typeWithdrawn, MoneyWithdrawn{Amount: 30}},
	{"acc-2", typeWithdrawn, MoneyWithdrawn{Amount: 60}}, // overdraws: parked, then replayed
	{"acc-3", typeWithdrawn, MoneyWithdrawn{Amount: 125}},
	{"acc-1", typeDeposited, MoneyDeposited{Amount: 50}},
	{"acc-2", typeDeposited, MoneyDeposited{Amount: 100}},
}

// config is the parsed command line.
type config struct {
	postgresDSN    string
	replicas       int
	connectTimeout time.Duration
	admin          string // -admin: serve the admin page on this address
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("projection", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.postgresDSN, "postgres", "", "run on this Postgres server instead of a temporary SQLite file\n(a URL or key=value DSN; the example creates its own schema and drops it at exit)")
	fs.IntVar(&cfg.replicas, "replicas", 1, fmt.Sprintf("number of subscribers running with the same name (1-%d)", maxReplicas))
	fs.DurationVar(&cfg.connectTimeout, "connect-timeout", 5*time.Second, "how long to wait for the Postgres server")
	fs.StringVar(&cfg.admin, "admin", "", "after parking the event, serve the admin page (admin.NewHandler) on this\naddress, e.g. 127.0.0.1:8080, to replay it from a browser; stops on Ctrl-C\n(loopback clients only; the database is kept until then)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: projection [-postgres DSN] [-replicas N] [-connect-timeout D] [-admin ADDR]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case cfg.replicas < 1 || cfg.replicas > maxReplicas:
		return cfg, fmt.Errorf("-replicas %d: must be between 1 and %d", cfg.replicas, maxReplicas)
	case cfg.connectTimeout <= 0:
		return cfg, fmt.Errorf("-connect-timeout %v: must be positive", cfg.connectTimeout)
	}
	return cfg, nil
}

// run is the whole program; main only adds signal handling and the exit.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "projection: %v\n", err)
		return 2
	}
	started := time.Now()
	// The library logs retries at WARN and parked events at ERROR.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	var be *backend
	if cfg.postgresDSN != "" {
		be, err = openPostgres(ctx, cfg, log)
	} else {
		be, err = openSQLite(cfg.replicas)
	}
	if err != nil {
		fmt.Fprintf(stderr, "projection: %v\n", err)
		return 1
	}
	defer func() {
		if err := be.close(); err != nil {
			fmt.Fprintf(stderr, "projection: cleanup: %v\n", err)
		}
	}()

	ex := &example{cfg: cfg, be: be, stdout: stdout, stderr: stderr, log: log}
	if err := ex.run(ctx); err != nil {
		fmt.Fprintf(stderr, "projection: %v\n", be.scrub(err.Error()))
		return 1
	}
	if cfg.admin != "" {
		return 0 // the scenario was left to the operator
	}
	fmt.Fprintf(stdout, "summary: %s, %d replica(s), %d events appended and projected, 1 parked and replayed, lag 0, handled once: yes, %.1fs\n",
		be.kind, cfg.replicas, len(script), time.Since(started).Seconds())
	return 0
}

// replica is what one subscriber process has: its own handles on the
// database (separate pools on Postgres) and its own wake-up channel.
type replica struct {
	db          *gorm.DB
	events      domain.EventStore // the store subscribers read (and the example appends through)
	checkpoints *subscriptions.GormCheckpointStore
	parking     *subscriptions.GormParkingLot
	wake        <-chan struct{}
}

// backend is one opened database with everything the example needs on it.
type backend struct {
	kind     string // "sqlite" or "postgres"
	describe string // where the data lives, for the first line of output
	replicas []*replica
	// start runs background helpers (the Postgres listeners) until ctx is
	// cancelled; wait waits for them.
	start func(ctx context.Context)
	wait  func()
	// scrub masks the DSN's password in a message.
	scrub   func(string) string
	closers []func() error
}

func newBackend(kind string) *backend {
	return &backend{kind: kind, start: func(context.Context) {}, wait: func() {}, scrub: func(s string) string { return s }}
}

// addCloser registers cleanup, run in reverse order by close.
func (b *backend) addCloser(f func() error) { b.closers = append(b.closers, f) }

// close releases everything the backend opened: pools, then the schema or
// the temporary directory.
func (b *backend) close() error {
	var errs []error
	for i := len(b.closers) - 1; i >= 0; i-- {
		errs = append(errs, b.closers[i]())
	}
	b.closers = nil
	return errors.Join(errs...)
}

// gormConfig returns a new configuration for each gorm.Open: GORM keeps
// the opened handle's state (dialector, connection pool, callbacks) in the
// *gorm.Config it is given, so each handle needs its own.
func gormConfig() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }

// openSQLite creates a SQLite file database in a new temporary directory,
// removed by close. N replicas share the one process's handle and stores.
func openSQLite(replicas int) (*backend, error) {
	be := newBackend("sqlite")
	dir, err := os.MkdirTemp("", "subscriptions-projection-")
	if err != nil {
		return nil, fmt.Errorf("create a temporary directory: %w", err)
	}
	be.addCloser(func() error { return os.RemoveAll(dir) })
	path := filepath.Join(dir, "example.db")
	be.describe = fmt.Sprintf("SQLite file %s (removed at exit)", path)

	db, err := gorm.Open(sqlite.Open(dsn.SQLiteFile(path)), gormConfig())
	if err != nil {
		_ = be.close()
		return nil, fmt.Errorf("open SQLite database %s: %w", path, err)
	}
	pool, err := db.DB()
	if err != nil {
		_ = be.close()
		return nil, fmt.Errorf("open SQLite database %s: %w", path, err)
	}
	be.addCloser(pool.Close)

	store, checkpoints, parking, err := openStores(db)
	if err != nil {
		_ = be.close()
		return nil, err
	}
	// SQLite has no NOTIFY: appends go through a NotifyingEventStore that
	// wakes every in-process subscriber (each on its own channel).
	notifier := subscriptions.NewInProcessNotifier()
	events := subscriptions.NewNotifyingEventStore(store, notifier.Notify)
	for range replicas {
		be.replicas = append(be.replicas, &replica{db: db, events: events, checkpoints: checkpoints, parking: parking, wake: notifier.Subscribe()})
	}
	return be, nil
}

// openStores creates the module's stores (and their tables) and the
// example's projection tables on db.
func openStores(db *gorm.DB) (*infrastructure.GormEventStore, *subscriptions.GormCheckpointStore, *subscriptions.GormParkingLot, error) {
	store, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create the event store: %w", err)
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create the checkpoint store: %w", err)
	}
	parking, err := subscriptions.NewGormParkingLot(db)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create the parking lot: %w", err)
	}
	for _, ddl := range []string{
		balancesDDL("balances"),
		// One row per event that a handler committed, with the number of
		// times it was committed: the example's proof of exactly-once.
		`CREATE TABLE IF NOT EXISTS handled_events (
			event_id text PRIMARY KEY,
			handled  integer NOT NULL,
			replica  integer NOT NULL
		)`,
	} {
		if err := db.Exec(ddl).Error; err != nil {
			return nil, nil, nil, fmt.Errorf("create the projection tables: %w", err)
		}
	}
	return store, checkpoints, parking, nil
}

// balancesDDL creates one version's balances table.
func balancesDDL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
		account_id text PRIMARY KEY,
		owner      text NOT NULL DEFAULT '',
		balance    bigint NOT NULL DEFAULT 0,
		events     integer NOT NULL DEFAULT 0
	)`
}

// openPostgres connects with a timeout, creates a fresh schema for the
// example's tables (dropped by close) and opens one pool and one listener
// per replica.
func openPostgres(ctx context.Context, cfg config, log *slog.Logger) (*backend, error) {
	be := newBackend("postgres")
	secrets := secret.FromDSN(cfg.postgresDSN)
	be.scrub = func(s string) string { return secret.Scrub(s, secrets) }

	pgcfg, err := pgx.ParseConfig(cfg.postgresDSN)
	if err != nil {
		// pgx quotes the DSN in its message with a best-effort redaction that
		// a malformed DSN can defeat: drop the quote, keep the reason.
		msg := err.Error()
		if i := strings.LastIndex(msg, "`: "); strings.HasPrefix(msg, "cannot parse `") && i >= 0 {
			msg = msg[i+3:]
		}
		return nil, fmt.Errorf("invalid -postgres DSN: %s (want postgres://user[:password]@host[:port]/database[?sslmode=disable] or key=value pairs)",
			be.scrub(msg))
	}
	if strings.Contains(pgcfg.Host, "@") {
		// An unescaped '@' in the password: the rest of it became the host.
		return nil, errors.New("invalid -postgres DSN: its host contains '@'; percent-encode an '@' in the user name or password as %40")
	}
	if pgcfg.Password != "" { // it may come from PGPASSWORD or ~/.pgpass
		secrets = secret.Normalize(append(secrets, pgcfg.Password))
	}
	if pgcfg.ConnectTimeout <= 0 || pgcfg.ConnectTimeout > cfg.connectTimeout {
		pgcfg.ConnectTimeout = cfg.connectTimeout
	}
	target := fmt.Sprintf("%s:%d (database %q, user %q)", pgcfg.Host, pgcfg.Port, pgcfg.Database, pgcfg.User)

	cctx, cancel := context.WithTimeout(ctx, cfg.connectTimeout)
	defer cancel()
	admin, err := pgx.ConnectConfig(cctx, pgcfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to Postgres at %s within %v: %s", target, cfg.connectTimeout, be.scrub(err.Error()))
	}
	var version string
	if err := admin.QueryRow(cctx, "SHOW server_version").Scan(&version); err != nil {
		_ = admin.Close(context.Background())
		return nil, fmt.Errorf("Postgres at %s: %s", target, be.scrub(err.Error()))
	}
	schema := "subscriptions_example_" + randomHex(6)
	if _, err := admin.Exec(cctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		_ = admin.Close(context.Background())
		return nil, fmt.Errorf("create schema %s on %s: %s", schema, target, be.scrub(err.Error()))
	}
	// Registered first, so it runs last: after every pool is closed.
	be.addCloser(func() error {
		defer admin.Close(context.Background())
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(dctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %s", schema, be.scrub(err.Error()))
		}
		return nil
	})
	be.describe = fmt.Sprintf("Postgres %s at %s, schema %s (dropped at exit)", version, target, schema)

	var listeners []*subscriptions.PostgresListener
	for i := range cfg.replicas {
		// A pool of its own per replica, as a separate process would have,
		// with the example's schema first on the search path.
		rcfg := pgcfg.Copy()
		rcfg.RuntimeParams["search_path"] = schema
		pool := stdlib.OpenDB(*rcfg)
		pool.SetMaxOpenConns(4)
		be.addCloser(pool.Close)
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: pool}), gormConfig())
		if err != nil {
			_ = be.close()
			return nil, fmt.Errorf("replica %d: open a pool on %s: %s", i+1, target, be.scrub(err.Error()))
		}
		store, checkpoints, parking, err := openStores(db)
		if err != nil {
			_ = be.close()
			return nil, fmt.Errorf("replica %d: %s", i+1, be.scrub(err.Error()))
		}
		// GormEventStore NOTIFYs on every commit; a listener per replica
		// (per process) turns that into wake-ups. LISTEN is per database, so
		// the listener needs no schema.
		listener, err := subscriptions.NewPostgresListener(cfg.postgresDSN, subscriptions.WithListenerLogger(log))
		if err != nil {
			_ = be.close()
			return nil, fmt.Errorf("replica %d: create the listener: %s", i+1, be.scrub(err.Error()))
		}
		listeners = append(listeners, listener)
		be.replicas = append(be.replicas, &replica{db: db, events: store, checkpoints: checkpoints, parking: parking, wake: listener.Subscribe()})
	}

	var wg sync.WaitGroup
	be.start = func(ctx context.Context) {
		for _, l := range listeners {
			wg.Go(func() {
				if err := l.Run(ctx); err != nil {
					log.Error("listener stopped", "error", be.scrub(err.Error()))
				}
			})
		}
	}
	be.wait = wg.Wait
	return be, nil
}

// example is one run of the scenario on an opened backend.
type example struct {
	cfg    config
	be     *backend
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger

	// fixed is the "deploy the fix" switch: until it is set, the withdrawal
	// handler refuses overdrafts (the bug).
	fixed atomic.Bool
	// invocations counts handler invocations per event ID, committed or
	// not (retries and batches re-run after a failure roll back).
	mu          sync.Mutex
	invocations map[string]int
	// versions is each account's last appended version (one appender).
	versions map[string]int
}

func (ex *example) run(ctx context.Context) error {
	out := ex.stdout
	ex.invocations = make(map[string]int)
	fmt.Fprintf(out, "database: %s\n", ex.be.describe)
	// Readers query the view, never a version's table: the blue/green
	// rebuild at the end switches it.
	if err := ex.be.replicas[0].db.WithContext(ctx).Exec(viewDDL("balances")).Error; err != nil {
		return fmt.Errorf("create the %s view: %w", liveView, err)
	}

	subs := make([]*subscriptions.Subscriber, len(ex.be.replicas))
	for i, r := range ex.be.replicas {
		sub, err := subscriptions.NewSubscriber(subscriberName, r.events, r.checkpoints, ex.dispatcher(i+1).Dispatch,
			subscriptions.WithWakeSignal(r.wake),
			subscriptions.WithBatchSize(2), // small batches, so that replicas take turns
			subscriptions.WithPollInterval(250*time.Millisecond),
			subscriptions.WithParkingLot(r.parking), // the same *gorm.DB as the checkpoints: parks atomically
			subscriptions.WithMaxRetries(2),
			subscriptions.WithRetryBackoff(20*time.Millisecond, 100*time.Millisecond),
			subscriptions.WithLogger(ex.log),
		)
		if err != nil {
			return err
		}
		subs[i] = sub
	}

	// Start the listeners (Postgres) and the subscribers; stop them all on
	// the way out, whatever happens.
	runCtx, stop := context.WithCancel(ctx)
	ex.be.start(runCtx)
	exited := make(chan error, len(subs))
	var wg sync.WaitGroup
	for _, sub := range subs {
		wg.Go(func() { exited <- sub.Run(runCtx) })
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			stop()
			wg.Wait()
			ex.be.wait()
		}
	}
	defer stopAll()
	fmt.Fprintf(out, "subscribers: %d running as %q (same name: they share one checkpoint)\n", len(subs), subscriberName)

	// With -admin, the admin handler samples from now on: its charts show
	// the catch-up below.
	var adminHandler *admin.Handler
	if ex.cfg.admin != "" {
		h, err := ex.newAdmin(subs[0])
		if err != nil {
			return err
		}
		defer h.Close()
		adminHandler = h
	}

	// Append the events, one commit per line of the script.
	ids, err := ex.appendScript(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "appended: %d events for 3 accounts; Bob's withdrawal of 60 overdraws his balance of 40 and the handler (deliberately buggy) refuses it\n", len(ids))
	fmt.Fprintf(out, "          it is retried twice, then parked (see the WARN/ERROR lines on stderr) while the events behind it flow on\n")

	first := subs[0]
	if err := ex.waitCaughtUp(ctx, first, exited); err != nil {
		return err
	}

	parked, err := first.ListParked(ctx)
	if err != nil {
		return err
	}
	if len(parked) != 1 {
		return fmt.Errorf("expected exactly 1 parked event, found %d", len(parked))
	}
	ex.printParked("parked events (before replay)", parked)
	if err := ex.printBalances(ctx, "balances (before replay; Bob's withdrawal is missing)"); err != nil {
		return err
	}

	if ex.cfg.admin != "" {
		ex.fixed.Store(true)
		fmt.Fprintln(out, "fixing the handler (overdrafts are allowed now); the parked event is left for you to replay")
		return ex.serveAdmin(ctx, adminHandler)
	}
	fmt.Fprintln(out, "fixing the handler (overdrafts are allowed now) and replaying the parked event")
	ex.fixed.Store(true)
	for _, p := range parked {
		if err := first.ReplayParked(ctx, p.EventID); err != nil {
			return err
		}
		fmt.Fprintf(out, "replayed: position %d (%s)\n", p.Position, p.EventType)
	}
	after, err := first.ListParked(ctx)
	if err != nil {
		return err
	}
	ex.printParked("parked events (after replay)", after)
	if len(after) != 0 {
		return fmt.Errorf("%d event(s) still parked after the replay", len(after))
	}
	if err := ex.printBalances(ctx, "balances (after replay)"); err != nil {
		return err
	}
	lag, err := first.Lag(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "lag: %d\n", lag)

	stopAll()
	for range subs {
		if err := <-exited; err != nil {
			return err
		}
	}
	if err := ex.checkHandledOnce(ctx, ids); err != nil {
		return err
	}
	if lag != 0 {
		return fmt.Errorf("lag is %d after catching up, want 0", lag)
	}
	return ex.blueGreen(ctx, first)
}

// dispatcher builds replica n's handler: a domain.EventDispatcher whose
// handlers run in registration order inside the batch transaction.
func (ex *example) dispatcher(n int) *domain.EventDispatcher {
	d := domain.NewEventDispatcher()
	must := func(err error) {
		if err != nil {
			panic(err) // only for empty patterns or nil handlers: a programming error
		}
	}

	// Registered first, so it runs first for every event: record that this
	// replica handled the event. If a later handler fails, this write rolls
	// back with the rest of the attempt.
	must(d.SubscribeWildcard(func(ctx context.Context, e domain.EventEnvelope[any]) error {
		ex.mu.Lock()
		ex.invocations[e.ID]++
		ex.mu.Unlock()
		return subscriptions.TxFromContext(ctx).Exec(`INSERT INTO handled_events (event_id, handled, replica) VALUES (?, 1, ?)
			ON CONFLICT (event_id) DO UPDATE SET handled = handled_events.handled + 1, replica = excluded.replica`, e.ID, n).Error
	}))

	must(domain.Subscribe(d, typeOpened, func(ctx context.Context, e domain.EventEnvelope[AccountOpened]) error {
		return upsertBalance(ctx, e.AggregateID, e.Payload.Owner, 0)
	}))
	must(domain.Subscribe(d, typeDeposited, func(ctx context.Context, e domain.EventEnvelope[MoneyDeposited]) error {
		return upsertBalance(ctx, e.AggregateID, "", e.Payload.Amount)
	}))
	must(domain.Subscribe(d, typeWithdrawn, func(ctx context.Context, e domain.EventEnvelope[MoneyWithdrawn]) error {
		tx := subscriptions.TxFromContext(ctx)
		if !ex.fixed.Load() {
			// The bug: the account aggregate allowed this withdrawal (the
			// event is a fact), but the projection refuses overdrafts.
			var balance int64
			if err := tx.Raw("SELECT balance FROM balances WHERE account_id = ?", e.AggregateID).Scan(&balance).Error; err != nil {
				return err
			}
			if balance < e.Payload.Amount {
				return fmt.Errorf("withdrawal of %d would overdraw %s (balance %d): overdrafts not supported", e.Payload.Amount, e.AggregateID, balance)
			}
		}
		return upsertBalance(ctx, e.AggregateID, "", -e.Payload.Amount)
	}))
	return d
}

// upsertBalance applies one event to the balances table through the batch
// transaction. It commutes with the other events of the account, so a
// parked event replayed later still yields the right balance.
func upsertBalance(ctx context.Context, account, owner string, delta int64) error {
	return upsertBalanceIn(ctx, "balances", account, owner, delta)
}

// upsertBalanceIn is upsertBalance on one version's table (a constant of
// the program, never input).
func upsertBalanceIn(ctx context.Context, table, account, owner string, delta int64) error {
	return subscriptions.TxFromContext(ctx).Exec(`INSERT INTO `+table+` (account_id, owner, balance, events) VALUES (?, ?, ?, 1)
		ON CONFLICT (account_id) DO UPDATE SET
			owner = CASE WHEN excluded.owner <> '' THEN excluded.owner ELSE `+table+`.owner END,
			balance = `+table+`.balance + excluded.balance,
			events = `+table+`.events + 1`, account, owner, delta).Error
}

// appendScript appends the script's events, each after the account's
// current version (optimistic concurrency), and returns their IDs.
func (ex *example) appendScript(ctx context.Context) ([]string, error) {
	ids := make([]string, 0, len(script))
	for _, s := range script {
		id, err := ex.append(ctx, s.account, s.event, s.payload)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// append appends one event after the account's current version.
func (ex *example) append(ctx context.Context, account, event string, payload any) (string, error) {
	if ex.versions == nil {
		ex.versions = map[string]int{}
	}
	version := ex.versions[account]
	env := domain.NewEventEnvelope(payload, account, event, version+1)
	if err := ex.be.replicas[0].events.Append(ctx, account, version, env); err != nil {
		return "", fmt.Errorf("append %s to %s: %w", event, account, err)
	}
	ex.versions[account] = version + 1
	return env.ID, nil
}

// waitCaughtUp prints a progress line whenever the subscriber's position
// moves, until the lag is 0.
func (ex *example) waitCaughtUp(ctx context.Context, sub *subscriptions.Subscriber, exited <-chan error) error {
	const limit = time.Minute
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	total := int64(len(script))
	last := int64(-1)
	for {
		lag, err := sub.Lag(ctx)
		if err != nil {
			return err
		}
		if done := total - lag; done != last {
			parked, err := sub.ListParked(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintf(ex.stdout, "progress: %d/%d events processed, %d parked, lag %d\n", done, total, len(parked), lag)
			last = done
		}
		if lag == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted while waiting for the subscriber: %w", ctx.Err())
		case err := <-exited:
			if err == nil {
				err = errors.New("it returned without an error")
			}
			return fmt.Errorf("a subscriber stopped unexpectedly: %w", err)
		case <-deadline.C:
			return fmt.Errorf("the subscriber did not catch up within %v (lag %d)", limit, lag)
		case <-tick.C:
		}
	}
}

func (ex *example) printParked(title string, parked []subscriptions.ParkedEvent) {
	if len(parked) == 0 {
		fmt.Fprintf(ex.stdout, "%s: none\n", title)
		return
	}
	fmt.Fprintf(ex.stdout, "%s:\n", title)
	for _, p := range parked {
		fmt.Fprintf(ex.stdout, "  position %d  %s  event %s  attempts %d\n    error: %s\n", p.Position, p.EventType, p.EventID, p.Attempts, handlerMessage(p.Error))
	}
}

// handlerMessage strips the dispatcher's wrapping ("dispatch event <id>
// (type "...") to handler #4 (main.MoneyWithdrawn): ") off an error, leaving
// the handler's own message.
func handlerMessage(msg string) string {
	if i := strings.Index(msg, ") to handler #"); i >= 0 {
		if j := strings.Index(msg[i:], "): "); j >= 0 {
			return msg[i+j+3:]
		}
	}
	return msg
}

func (ex *example) printBalances(ctx context.Context, title string) error {
	var rows []struct {
		AccountID string
		Owner     string
		Balance   int64
		Events    int
	}
	if err := ex.be.replicas[0].db.WithContext(ctx).Raw("SELECT account_id, owner, balance, events FROM " + liveView + " ORDER BY account_id").Scan(&rows).Error; err != nil {
		return fmt.Errorf("read the projection: %w", err)
	}
	fmt.Fprintf(ex.stdout, "%s:\n", title)
	tw := tabwriter.NewWriter(ex.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  account\towner\tbalance\tevents\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t\n", r.AccountID, r.Owner, r.Balance, r.Events)
	}
	return tw.Flush()
}

// checkHandledOnce verifies, from the handled_events table the handlers
// wrote through their batch transactions, that every appended event's
// effects were committed exactly once, whichever replica handled it.
func (ex *example) checkHandledOnce(ctx context.Context, ids []string) error {
	var rows []struct {
		EventID string
		Handled int
		Replica int
	}
	if err := ex.be.replicas[0].db.WithContext(ctx).Raw("SELECT event_id, handled, replica FROM handled_events").Scan(&rows).Error; err != nil {
		return fmt.Errorf("read handled_events: %w", err)
	}
	handled := make(map[string]int, len(rows))
	perReplica := make(map[int]int)
	for _, r := range rows {
		handled[r.EventID] = r.Handled
		perReplica[r.Replica]++
	}
	var bad []string
	for _, id := range ids {
		if n := handled[id]; n != 1 {
			bad = append(bad, fmt.Sprintf("%s handled %d times", id, n))
		}
	}
	if len(rows) != len(ids) {
		bad = append(bad, fmt.Sprintf("%d events handled, %d appended", len(rows), len(ids)))
	}

	ex.mu.Lock()
	invocations := 0
	for _, n := range ex.invocations {
		invocations += n
	}
	ex.mu.Unlock()
	var split []string
	for i := 1; i <= len(ex.be.replicas); i++ {
		split = append(split, fmt.Sprintf("#%d: %d", i, perReplica[i]))
	}
	fmt.Fprintf(ex.stdout, "events committed per replica: %s\n", strings.Join(split, ", "))
	if len(ex.be.replicas) > 1 {
		fmt.Fprintln(ex.stdout, "  (one replica runs each batch and the others skip it; the replay ran on #1)")
	}
	fmt.Fprintf(ex.stdout, "handler invocations: %d for %d events (%d rolled back: failed attempts, and batches re-run without the failing event)\n",
		invocations, len(ids), invocations-len(ids))
	if len(bad) > 0 {
		fmt.Fprintf(ex.stdout, "handled once: NO (%s)\n", strings.Join(bad, "; "))
		return errors.New("some events were not handled exactly once")
	}
	fmt.Fprintf(ex.stdout, "handled once: yes (each of the %d events committed exactly once)\n", len(ids))
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
