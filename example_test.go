package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// exQuietLogger keeps the examples' stderr free of the subscriber's
// lifecycle and retry logs.
func exQuietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// exStart runs sub in the background and returns the function that stops
// it and waits for Run to return.
func exStart(sub *subscriptions.Subscriber) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			panic(err)
		}
	}
}

// exWaitCaughtUp waits until sub's checkpoint has reached the feed head.
func exWaitCaughtUp(sub *subscriptions.Subscriber) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := sub.Lag(ctx)
		if err != nil {
			panic(err)
		}
		if lag == 0 {
			return
		}
		select {
		case <-ctx.Done():
			panic(fmt.Sprintf("subscriber %q did not catch up: lag %d", sub.Name(), lag))
		case <-tick.C:
		}
	}
}

// exCheck panics on an error: examples have no *testing.T.
func exCheck(err error) {
	if err != nil {
		panic(err)
	}
}

// A subscriber over an in-memory store: the handler sees every event of
// every aggregate once, in the feed's global order. The memory checkpoint
// store gives at-least-once delivery; see Example_projection for
// exactly-once on a database.
func ExampleNewSubscriber() {
	ctx := context.Background()
	store := infrastructure.NewMemoryStore()
	exCheck(store.Append(ctx, "user-1", 0, domain.NewEventEnvelope[any]("ada", "user-1", "user.registered", 1)))
	exCheck(store.Append(ctx, "user-2", 0, domain.NewEventEnvelope[any]("grace", "user-2", "user.registered", 1)))
	exCheck(store.Append(ctx, "user-1", 1, domain.NewEventEnvelope[any]("ada lovelace", "user-1", "user.renamed", 2)))

	printEvent := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		fmt.Printf("%d %s %s %v\n", e.Position, e.AggregateID, e.EventType, e.Payload)
		return nil
	}
	sub, err := subscriptions.NewSubscriber("printer", store, subscriptions.NewMemoryCheckpointStore(), printEvent,
		subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithLogger(exQuietLogger()),
	)
	exCheck(err)

	stop := exStart(sub)
	exWaitCaughtUp(sub)
	stop()
	// Output:
	// 1 user-1 user.registered ada
	// 2 user-2 user.registered grace
	// 3 user-1 user.renamed ada lovelace
}

// The README's quick start: a projection on a SQLite file, written through
// the batch transaction so that it commits together with the checkpoint.
func Example_projection() {
	ctx := context.Background()
	check := func(err error) {
		if err != nil {
			panic(err)
		}
	}

	// A SQLite file with the DSN the module needs: WAL, a busy timeout and
	// immediate transactions.
	dir, err := os.MkdirTemp("", "quickstart-")
	check(err)
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	check(err)
	sqlDB, err := db.DB()
	check(err)
	defer sqlDB.Close()

	store, err := infrastructure.NewGormEventStore(db)
	check(err)
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	check(err)
	check(db.Exec("CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)").Error)

	// A typed handler (the stored JSON payload is decoded into Deposited).
	// It writes through the batch transaction: the balance and the
	// subscriber's checkpoint commit together, so each event counts once.
	type Deposited struct{ Amount int }
	dispatcher := domain.NewEventDispatcher()
	check(domain.Subscribe(dispatcher, "account.deposited", func(ctx context.Context, e domain.EventEnvelope[Deposited]) error {
		return subscriptions.TxFromContext(ctx).Exec(`INSERT INTO balances (account, balance) VALUES (?, ?)
			ON CONFLICT (account) DO UPDATE SET balance = balances.balance + excluded.balance`, e.AggregateID, e.Payload.Amount).Error
	}))

	// Appends through the notifying store wake the subscriber at once.
	notifier := subscriptions.NewInProcessNotifier()
	events := subscriptions.NewNotifyingEventStore(store, notifier.Notify)
	sub, err := subscriptions.NewSubscriber("balances", events, checkpoints, dispatcher.Dispatch,
		subscriptions.WithWakeSignal(notifier.Subscribe()))
	check(err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()

	// SequenceNo numbers an aggregate's events 1, 2, 3, ...; 0 lets the store pick.
	for version, amount := range []int{100, 250, 50} {
		event := domain.NewEventEnvelope[any](Deposited{Amount: amount}, "acc-1", "account.deposited", version+1)
		check(events.Append(ctx, "acc-1", version, event))
	}

	// An app runs the subscriber until shutdown; here, wait until it has
	// caught up (lag 0), then stop it.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := sub.Lag(ctx)
		check(err)
		if lag == 0 {
			break
		}
		<-tick.C
	}
	stop()
	check(<-done)

	var balance int
	check(db.Raw("SELECT balance FROM balances WHERE account = ?", "acc-1").Scan(&balance).Error)
	fmt.Println("acc-1 balance:", balance)
	// Output: acc-1 balance: 400
}

// An EventDispatcher is a Handler: its Dispatch method routes each event
// to the handlers registered for matching patterns, in registration order,
// with the payload decoded into each handler's type.
func Example_dispatcher() {
	type OrderPlaced struct {
		Item     string
		Quantity int
	}
	type OrderShipped struct{ Carrier string }

	dispatcher := domain.NewEventDispatcher()
	exCheck(domain.Subscribe(dispatcher, "order.placed", func(ctx context.Context, e domain.EventEnvelope[OrderPlaced]) error {
		fmt.Printf("%s placed: %d x %s\n", e.AggregateID, e.Payload.Quantity, e.Payload.Item)
		return nil
	}))
	exCheck(domain.Subscribe(dispatcher, "order.shipped", func(ctx context.Context, e domain.EventEnvelope[OrderShipped]) error {
		fmt.Printf("%s shipped with %s\n", e.AggregateID, e.Payload.Carrier)
		return nil
	}))
	// "*" matches one segment: this handler sees every order event, after
	// the handlers registered before it.
	exCheck(domain.Subscribe(dispatcher, "order.*", func(ctx context.Context, e domain.EventEnvelope[any]) error {
		fmt.Printf("  audit: position %d, %s\n", e.Position, e.EventType)
		return nil
	}))

	ctx := context.Background()
	store := infrastructure.NewMemoryStore()
	exCheck(store.Append(ctx, "order-7", 0,
		domain.NewEventEnvelope[any](OrderPlaced{Item: "teapot", Quantity: 2}, "order-7", "order.placed", 1),
		// A payload as a database store returns it (decoded JSON); the typed
		// handler still receives an OrderShipped.
		domain.NewEventEnvelope[any](map[string]any{"Carrier": "DHL"}, "order-7", "order.shipped", 2),
	))

	sub, err := subscriptions.NewSubscriber("orders", store, subscriptions.NewMemoryCheckpointStore(), dispatcher.Dispatch,
		subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithLogger(exQuietLogger()),
	)
	exCheck(err)
	stop := exStart(sub)
	exWaitCaughtUp(sub)
	stop()
	// Output:
	// order-7 placed: 2 x teapot
	//   audit: position 1, order.placed
	// order-7 shipped with DHL
	//   audit: position 2, order.shipped
}

// TxFromContext hands a handler the batch transaction of a
// GormCheckpointStore. Writes through it commit with the checkpoint
// advance, or vanish with it: the steps below are what a Subscriber does
// for each batch.
func ExampleTxFromContext() {
	ctx := context.Background()
	// In-memory SQLite lives on one connection: a second one would be a
	// different, empty database.
	db, err := gorm.Open(sqlite.Open("file:/example-txfromcontext?vfs=memdb&_txlock=immediate"), &gorm.Config{Logger: logger.Discard})
	exCheck(err)
	sqlDB, err := db.DB()
	exCheck(err)
	sqlDB.SetMaxOpenConns(1)
	defer sqlDB.Close()
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	exCheck(err)
	exCheck(db.Exec("CREATE TABLE seen (event_id TEXT PRIMARY KEY)").Error)

	handler := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		tx := subscriptions.TxFromContext(ctx)
		if tx == nil {
			return errors.New("not running in a database batch")
		}
		return tx.Exec("INSERT INTO seen (event_id) VALUES (?)", e.ID).Error
	}
	event := domain.NewEventEnvelope[any]("payload", "agg-1", "thing.happened", 1)
	event.Position = 1
	report := func(step string) {
		var rows int64
		exCheck(db.Table("seen").Count(&rows).Error)
		position, err := checkpoints.Position(ctx, "seen")
		exCheck(err)
		fmt.Printf("%s: %d row(s), checkpoint %d\n", step, rows, position)
	}

	fmt.Println("outside a batch:", handler(ctx, event))

	batch, acquired, err := checkpoints.Acquire(ctx, "seen")
	exCheck(err)
	fmt.Println("acquired:", acquired)
	exCheck(handler(batch.HandlerContext(ctx), event))
	exCheck(batch.Rollback())
	report("after rollback")

	batch, _, err = checkpoints.Acquire(ctx, "seen")
	exCheck(err)
	exCheck(handler(batch.HandlerContext(ctx), event))
	exCheck(batch.Commit(ctx, event.Position))
	report("after commit")
	// Output:
	// outside a batch: not running in a database batch
	// acquired: true
	// after rollback: 0 row(s), checkpoint 0
	// after commit: 1 row(s), checkpoint 1
}

// A handler that keeps failing on one event has the event parked after its
// retries; the events behind it flow on. Once the handler is fixed,
// ReplayParked runs it again and clears the entry.
func ExampleSubscriber_ReplayParked() {
	ctx := context.Background()
	store := infrastructure.NewMemoryStore()
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		exCheck(store.Append(ctx, order, 0, domain.NewEventEnvelope[any](nil, order, "order.placed", 1)))
	}

	var fixed atomic.Bool
	var mu sync.Mutex
	var shipped []string
	ship := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		if e.AggregateID == "order-2" && !fixed.Load() {
			return errors.New("carrier rejected the address")
		}
		mu.Lock()
		defer mu.Unlock()
		// Memory checkpoints deliver at least once: stay idempotent.
		if !slices.Contains(shipped, e.AggregateID) {
			shipped = append(shipped, e.AggregateID)
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber("shipping", store, subscriptions.NewMemoryCheckpointStore(), ship,
		subscriptions.WithParkingLot(subscriptions.NewMemoryParkingLot()),
		subscriptions.WithMaxRetries(1),
		subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond),
		subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithLogger(exQuietLogger()),
	)
	exCheck(err)
	stop := exStart(sub)
	exWaitCaughtUp(sub)
	stop()

	parked, err := sub.ListParked(ctx)
	exCheck(err)
	for _, p := range parked {
		fmt.Printf("parked: position %d after %d attempts: %s\n", p.Position, p.Attempts, p.Error)
	}
	fmt.Println("shipped:", shipped)

	fixed.Store(true)
	for _, p := range parked {
		exCheck(sub.ReplayParked(ctx, p.EventID))
	}
	parked, err = sub.ListParked(ctx)
	exCheck(err)
	fmt.Println("parked after replay:", len(parked))
	fmt.Println("shipped:", shipped)
	// Output:
	// parked: position 2 after 2 attempts: carrier rejected the address
	// shipped: [order-1 order-3]
	// parked after replay: 0
	// shipped: [order-1 order-3 order-2]
}

// A handler that writes its projection on every delivery but sends its
// email only on live ones: a rebuild (ResetCheckpointWith) re-delivers the
// events whose emails went out the first time, and DeliveryFrom says so.
func ExampleDeliveryFrom() {
	ctx := context.Background()
	store := infrastructure.NewMemoryStore()
	for _, order := range []string{"order-1", "order-2"} {
		exCheck(store.Append(ctx, order, 0, domain.NewEventEnvelope[any](nil, order, "order.placed", 1)))
	}

	var mu sync.Mutex
	orders := map[string]string{} // the projection
	notify := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		d := subscriptions.DeliveryFrom(ctx)
		mu.Lock()
		defer mu.Unlock()
		orders[e.AggregateID] = "placed"
		if d.Replay() {
			fmt.Printf("%s: projection only (%s through %d)\n", e.AggregateID, d.Kind, d.Through)
			return nil
		}
		fmt.Printf("%s: email sent\n", e.AggregateID)
		return nil
	}
	sub, err := subscriptions.NewSubscriber("order-emails", store, subscriptions.NewMemoryCheckpointStore(), notify,
		subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithLogger(exQuietLogger()),
	)
	exCheck(err)
	stop := exStart(sub)
	exWaitCaughtUp(sub)

	// Rebuild the projection in place while the subscriber runs.
	exCheck(sub.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		clear(orders)
		return nil
	}))
	exWaitCaughtUp(sub)
	exCheck(store.Append(ctx, "order-3", 0, domain.NewEventEnvelope[any](nil, "order-3", "order.placed", 1)))
	exWaitCaughtUp(sub)
	stop()
	fmt.Println("orders:", len(orders))
	// Output:
	// order-1: email sent
	// order-2: email sent
	// order-1: projection only (redelivery through 2)
	// order-2: projection only (redelivery through 2)
	// order-3: email sent
	// orders: 3
}

// A rebuild at COPY's speed: a batch handler writes each batch's rows
// with one COPY through the batch transaction, so that they commit with
// the checkpoint advance (each deposit once, whatever crashes come). It
// needs Postgres: TestExampleCopyFrom runs it against the test server,
// as an Example cannot skip when no server answers.
func ExampleCopyFrom() {
	ctx := context.Background()
	db, done := exPostgres() // gorm.Open(postgres.Open(dsn), ...) in an application
	defer done()
	events, err := infrastructure.NewGormEventStore(db)
	exCheck(err)
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	exCheck(err)
	exCheck(db.Exec("CREATE TABLE deposits (event_id text PRIMARY KEY, account text NOT NULL, amount numeric NOT NULL)").Error)
	for i, amount := range []float64{10, 20, 30} {
		ev := domain.NewEventEnvelope[any](map[string]any{"account": "acc-1", "amount": amount}, fmt.Sprintf("deposit-%d", i), "deposit.made", 1)
		exCheck(events.Append(ctx, ev.AggregateID, 0, ev))
	}

	rebuild := func(ctx context.Context, deposits []domain.EventEnvelope[any]) error {
		rows := make([][]any, len(deposits))
		for i, ev := range deposits {
			p := ev.Payload.(map[string]any)
			rows[i] = []any{ev.ID, p["account"], p["amount"]}
		}
		_, err := subscriptions.CopyFrom(ctx, pgx.Identifier{"deposits"}, []string{"event_id", "account", "amount"}, pgx.CopyFromRows(rows))
		return err
	}
	sub, err := subscriptions.NewSubscriber("deposits", events, checkpoints, nil,
		subscriptions.WithBatchHandler(rebuild), subscriptions.WithBatchSize(1000),
		subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(exQuietLogger()))
	exCheck(err)
	stop := exStart(sub)
	exWaitCaughtUp(sub)
	stop()

	var n int
	var total float64
	exCheck(db.Raw("SELECT COUNT(*), SUM(amount)::float8 FROM deposits").Row().Scan(&n, &total))
	fmt.Printf("%d deposits, %.2f in all\n", n, total)
	// It prints:
	//
	//	3 deposits, 60.00 in all
}

// exPostgres opens a GORM pool on a schema of its own on the test server
// (SUBSCRIPTIONS_POSTGRES_DSN), dropped by done.
func exPostgres() (*gorm.DB, func()) {
	ctx := context.Background()
	dsn := os.Getenv("SUBSCRIPTIONS_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	admin, err := pgx.Connect(ctx, dsn)
	exCheck(err)
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	exCheck(err)
	cfg, err := pgx.ParseConfig(dsn)
	exCheck(err)
	cfg.RuntimeParams["search_path"] = schema
	pool := stdlib.OpenDB(*cfg)
	pool.SetMaxOpenConns(4)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: pool}), &gorm.Config{Logger: logger.Discard})
	exCheck(err)
	return db, func() {
		_ = pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
}

// A Group runs one definition for every tenant on a fixed pool of
// workers; here two tenants on memory stores (on Postgres, a schema or a
// database each, see Feed). Tenants can be added and removed while it
// runs; the handler learns whose event it has from its context.
func ExampleGroup() {
	ctx := context.Background()
	var mu sync.Mutex
	welcomed := map[string][]string{}
	welcome := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		mu.Lock()
		defer mu.Unlock()
		tenant := subscriptions.TenantFromContext(ctx)
		welcomed[tenant] = append(welcomed[tenant], fmt.Sprint(e.Payload))
		return nil
	}
	group, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "welcome", Handler: welcome}},
		subscriptions.WithGroupWorkers(2), subscriptions.WithGroupPollInterval(10*time.Millisecond),
		subscriptions.WithGroupLogger(exQuietLogger()))
	exCheck(err)
	for _, tenant := range []string{"acme", "globex"} {
		store := infrastructure.NewMemoryStore()
		exCheck(store.Append(ctx, "user-1", 0, domain.NewEventEnvelope[any](tenant+"'s first user", "user-1", "user.registered", 1)))
		exCheck(group.Add(subscriptions.Feed{Tenant: tenant, Events: store, Checkpoints: subscriptions.NewMemoryCheckpointStore()}))
	}

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- group.Run(rctx) }()
	for _, tenant := range group.Tenants() {
		sub, err := group.Subscriber(tenant, "welcome")
		exCheck(err)
		exWaitCaughtUp(sub)
	}
	cancel()
	exCheck(<-done)
	fmt.Println(welcomed["acme"], welcomed["globex"])
	// Output:
	// [acme's first user] [globex's first user]
}
