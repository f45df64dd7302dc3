// Package sqliteconf checks, when a store is constructed, that a SQLite
// handle is one the module can keep its guarantees on, so that a
// configuration that cannot work is refused at once, with the fix, rather
// than failing later ("database is locked") or losing data silently.
//
// What the module needs from SQLite, and why (docs/sqlite.md has the
// measurements):
//
//   - A busy timeout. A batch holds SQLite's write lock while its handlers
//     run; every other writer (an append, another subscriber's batch, a
//     Reset) must wait for it rather than fail. Both common drivers
//     (github.com/mattn/go-sqlite3 through gorm.io/driver/sqlite, and
//     github.com/glebarez/sqlite) default to 5 s; a DSN that sets 0 is
//     refused.
//   - One database behind every connection of the pool. A private
//     in-memory database (":memory:") is a different, empty database on each
//     connection: with a pool that can open a second connection, appends
//     acknowledged on one are never seen by a subscriber reading on
//     another. Any in-memory database is therefore refused on a pool that
//     may open more than one connection.
//
// The journal mode and the transaction mode are not needed: every write
// transaction of the module writes first, so SQLite's busy handler applies
// in WAL and rollback-journal mode alike, and no transaction has to upgrade
// a read lock. WAL only makes readers and the writer not wait for each
// other.
package sqliteconf

import (
	"context"
	"database/sql"
	"fmt"

	"gorm.io/gorm"
)

// Check returns an error naming the setting and its fix when db (a SQLite
// handle on pool) cannot be used by the module's stores. constructor names
// the caller in the message.
func Check(ctx context.Context, db *gorm.DB, pool *sql.DB, constructor string) error {
	db = db.WithContext(ctx)
	var timeouts []int64
	if err := db.Raw("PRAGMA busy_timeout").Scan(&timeouts).Error; err != nil {
		return fmt.Errorf("%s: read SQLite busy_timeout: %w", constructor, err)
	}
	if len(timeouts) == 1 && timeouts[0] <= 0 {
		return fmt.Errorf("%s: the SQLite connection has busy_timeout 0, so writers waiting for a batch would fail with \"database is locked\": "+
			"leave the driver's default (5 s) or set one in the DSN (_busy_timeout=10000 for gorm.io/driver/sqlite, _pragma=busy_timeout(10000) for github.com/glebarez/sqlite)", constructor)
	}
	var files []string
	if err := db.Raw("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&files).Error; err != nil {
		return fmt.Errorf("%s: locate the SQLite database file: %w", constructor, err)
	}
	inMemory := len(files) == 1 && files[0] == ""
	if max := pool.Stats().MaxOpenConnections; inMemory && max != 1 {
		limit := "no limit"
		if max > 1 {
			limit = fmt.Sprintf("up to %d", max)
		}
		return fmt.Errorf("%s: the SQLite database is in memory and the pool may open more than one connection (%s): "+
			"a private in-memory database is a different, empty database on each connection, so acknowledged appends would be lost; "+
			"call SetMaxOpenConns(1) on the pool (db.DB()) before constructing the stores, or use a database file", constructor, limit)
	}
	return nil
}
