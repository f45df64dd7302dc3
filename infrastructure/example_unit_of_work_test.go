package infrastructure_test

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// A unit of work: the application's own state change and the events that
// record it commit together, or not at all. Build the store on the
// transaction; its Append then runs inside it, on SQLite and on Postgres
// alike (where the append lock and the NOTIFY take effect at the
// transaction's commit). On Postgres the transaction must be READ
// COMMITTED, the default, and it holds the append lock from its Append to
// its end: keep it short.
func ExampleNewGormEventStore_unitOfWork() {
	ctx := context.Background()
	db, err := gorm.Open(sqlite.Open("file:/uow?vfs=memdb&_busy_timeout=10000&_txlock=immediate"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(1) // an in-memory database lives on one connection
	if err := db.Exec("CREATE TABLE accounts (id text PRIMARY KEY, owner text)").Error; err != nil {
		panic(err)
	}

	open := func(id, owner string) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			store, err := infrastructure.NewGormEventStore(tx)
			if err != nil {
				return err
			}
			if err := tx.Exec("INSERT INTO accounts (id, owner) VALUES (?, ?)", id, owner).Error; err != nil {
				return err
			}
			opened := domain.NewEventEnvelope[any](map[string]any{"owner": owner}, id, "account.opened", 0)
			if err := store.Append(ctx, id, 0, opened); err != nil {
				return err
			}
			if owner == "" {
				return errors.New("no owner") // rolls back the row and the event
			}
			return nil
		})
	}
	fmt.Println(open("acc-1", "ann"))
	fmt.Println(open("acc-2", ""))

	store, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		panic(err)
	}
	feed, _ := store.ReadAfter(ctx, 0, 0)
	var accounts int64
	db.Raw("SELECT COUNT(*) FROM accounts").Scan(&accounts)
	fmt.Println(len(feed), "event,", accounts, "account:", feed[0].AggregateID)
	// Output:
	// <nil>
	// no owner
	// 1 event, 1 account: acc-1
}
