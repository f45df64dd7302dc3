package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/migrations"
)

// Verify checks a schema without changing it; Migrate applies what is
// missing, once. An application whose role may not create tables runs
// the files with its migration tool and starts its stores with
// WithSchemaVerifyOnly, which calls Verify.
func ExampleVerify() {
	dir, err := os.MkdirTemp("", "migrations-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+"?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	ctx := context.Background()

	err = migrations.Verify(ctx, db)
	fmt.Println("empty database, schema mismatch:", errors.Is(err, migrations.ErrSchemaMismatch))

	if err := migrations.Migrate(ctx, db); err != nil {
		panic(err)
	}
	fmt.Println("after Migrate:", migrations.Verify(ctx, db))
	// Output:
	// empty database, schema mismatch: true
	// after Migrate: <nil>
}
