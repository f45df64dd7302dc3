package pgxstore_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// DBTX and Queries stand for the code sqlc generates with
// sql_package: "pgx/v5": New takes any DBTX, and pgxstore.TxFromContext
// is one.
type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
}

func New(db DBTX) *Queries { return &Queries{db: db} }

type Queries struct{ db DBTX }

const addToTotal = `INSERT INTO order_totals (customer, total) VALUES ($1, $2)
ON CONFLICT (customer) DO UPDATE SET total = order_totals.total + excluded.total`

func (q *Queries) AddToTotal(ctx context.Context, customer string, amount float64) error {
	_, err := q.db.Exec(ctx, addToTotal, customer, amount)
	return err
}

// A projection on pgx alone: the event store, the checkpoints and the
// handler's writes share one pgxpool, and the handler's sqlc queries run
// in the batch transaction, so each order is added to its customer's
// total exactly once, whatever crashes or replicas come.
func Example() {
	ctx := context.Background()
	pool, done := exampleDatabase(ctx) // pgxpool.New(ctx, dsn) in an application
	defer done()

	events, err := pgxstore.NewEventStore(ctx, pool) // applies the module's migrations
	if err != nil {
		log.Fatal(err)
	}
	checkpoints, err := pgxstore.NewCheckpointStore(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE order_totals (customer text PRIMARY KEY, total numeric NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	for i, order := range []struct {
		customer string
		amount   float64
	}{{"ada", 12.5}, {"bob", 3}, {"ada", 7.5}} {
		ev := domain.NewEventEnvelope[any](map[string]any{"customer": order.customer, "amount": order.amount},
			fmt.Sprintf("order-%d", i), "order.placed", 1)
		if err := events.Append(ctx, ev.AggregateID, 0, ev); err != nil {
			log.Fatal(err)
		}
	}

	project := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		order := ev.Payload.(map[string]any)
		return New(pgxstore.TxFromContext(ctx)).AddToTotal(ctx, order["customer"].(string), order["amount"].(float64))
	}
	sub, err := subscriptions.NewSubscriber("order-totals", events, checkpoints, project,
		subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- sub.Run(runCtx) }()
	if _, err := sub.WaitCaughtUp(ctx); err != nil {
		log.Fatal(err)
	}
	stop()
	<-stopped

	rows, _ := pool.Query(ctx, "SELECT customer, total::float8 FROM order_totals ORDER BY customer")
	var customer string
	var total float64
	_, err = pgx.ForEachRow(rows, []any{&customer, &total}, func() error {
		fmt.Printf("%s %.2f\n", customer, total)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// It prints (TestExample runs it against the test server, as an
	// Example cannot skip when no server answers):
	//
	//	ada 20.00
	//	bob 3.00
}

// A unit of work: a command's own write and the event that records it
// commit together, or neither does. The transaction is the caller's; it
// holds the append lock from AppendTx to its end, so it is kept short.
func ExampleEventStore_AppendTx() {
	ctx := context.Background()
	pool, done := exampleDatabase(ctx)
	defer done()
	events, err := pgxstore.NewEventStore(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE accounts (id text PRIMARY KEY, owner text NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	open := func(id, owner string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO accounts (id, owner) VALUES ($1, $2)", id, owner); err != nil {
				return err
			}
			opened := domain.NewEventEnvelope[any](map[string]any{"owner": owner}, id, "account.opened", 0)
			return events.AppendTx(ctx, tx, id, 0, opened)
		})
	}
	fmt.Println(open("acc-1", "ann"))
	fmt.Println(open("acc-1", "bob") != nil) // the row exists: neither is written

	feed, err := events.ReadAfter(ctx, 0, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(feed), "event:", feed[0].AggregateID)
	// It prints (TestExample runs it against the test server):
	//
	//	<nil>
	//	true
	//	1 event: acc-1
}

// A rebuild at COPY's speed: a batch handler writes each batch's rows
// with one COPY through the batch transaction (the pgx.Tx's CopyFrom), so
// that they commit with the checkpoint advance, each deposit once.
func ExampleTxFromContext_copy() {
	ctx := context.Background()
	pool, done := exampleDatabase(ctx)
	defer done()
	events, err := pgxstore.NewEventStore(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	checkpoints, err := pgxstore.NewCheckpointStore(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE deposits (event_id text PRIMARY KEY, account text NOT NULL, amount numeric NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	for i, amount := range []float64{10, 20, 30} {
		ev := domain.NewEventEnvelope[any](map[string]any{"account": "acc-1", "amount": amount}, fmt.Sprintf("deposit-%d", i), "deposit.made", 1)
		if err := events.Append(ctx, ev.AggregateID, 0, ev); err != nil {
			log.Fatal(err)
		}
	}

	rebuild := func(ctx context.Context, deposits []domain.EventEnvelope[any]) error {
		rows := make([][]any, len(deposits))
		for i, ev := range deposits {
			p := ev.Payload.(map[string]any)
			rows[i] = []any{ev.ID, p["account"], p["amount"]}
		}
		_, err := pgxstore.TxFromContext(ctx).CopyFrom(ctx, pgx.Identifier{"deposits"}, []string{"event_id", "account", "amount"}, pgx.CopyFromRows(rows))
		return err
	}
	sub, err := subscriptions.NewSubscriber("deposits", events, checkpoints, nil,
		subscriptions.WithBatchHandler(rebuild), subscriptions.WithBatchSize(1000),
		subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- sub.Run(runCtx) }()
	if _, err := sub.WaitCaughtUp(ctx); err != nil {
		log.Fatal(err)
	}
	stop()
	<-stopped

	var n int
	var total float64
	if err := pool.QueryRow(ctx, "SELECT COUNT(*), SUM(amount)::float8 FROM deposits").Scan(&n, &total); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d deposits, %.2f in all\n", n, total)
	// It prints (TestExample runs it against the test server):
	//
	//	3 deposits, 60.00 in all
}

// exampleDatabase opens a pool on a schema of its own on the test server
// (SUBSCRIPTIONS_POSTGRES_DSN), dropped by done.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	dsn := os.Getenv("SUBSCRIPTIONS_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	schema := fmt.Sprintf("pgxstore_example_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
}
