package subscriptions_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// A handler that writes its projection with plain database/sql statements
// (or sqlc's generated queries: SQLTx is sqlc's DBTX) through the batch
// transaction, so that each write commits with the checkpoint advance.
// GORM is only how the stores are opened; the handler never touches it.
// On Postgres the same handler runs unchanged ($1 placeholders are pgx's).
func ExampleSQLTxFromContext() {
	dir, err := os.MkdirTemp("", "sqltx-")
	exCheck(err)
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	exCheck(err)
	sqlDB, err := db.DB() // the application's own *sql.DB
	exCheck(err)
	defer sqlDB.Close()

	ctx := context.Background()
	store, err := infrastructure.NewGormEventStore(db)
	exCheck(err)
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	exCheck(err)
	_, err = sqlDB.ExecContext(ctx, "CREATE TABLE stock (item TEXT PRIMARY KEY, quantity INTEGER NOT NULL)")
	exCheck(err)

	handler := func(ctx context.Context, e domain.EventEnvelope[any]) error {
		tx := subscriptions.SQLTxFromContext(ctx)
		payload := e.Payload.(map[string]any) // a JSON object read back from the store
		_, err := tx.ExecContext(ctx, `INSERT INTO stock (item, quantity) VALUES ($1, $2)
			ON CONFLICT (item) DO UPDATE SET quantity = stock.quantity + excluded.quantity`,
			e.AggregateID, payload["quantity"])
		return err
	}
	sub, err := subscriptions.NewSubscriber("stock", store, checkpoints, handler,
		subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(exQuietLogger()))
	exCheck(err)

	for version, quantity := range []int{5, 3, -2} {
		event := domain.NewEventEnvelope[any](map[string]any{"quantity": quantity}, "widget", "stock.moved", version+1)
		exCheck(store.Append(ctx, "widget", version, event))
	}
	stop := exStart(sub)
	exWaitCaughtUp(sub)
	stop()

	var quantity int
	exCheck(sqlDB.QueryRowContext(ctx, "SELECT quantity FROM stock WHERE item = $1", "widget").Scan(&quantity))
	fmt.Println("widget quantity:", quantity)
	// Output: widget quantity: 6
}
