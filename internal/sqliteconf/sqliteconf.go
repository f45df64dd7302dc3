// Package sqliteconf checks, when a store is constructed, that a SQLite
// handle is one the module can keep its guarantees on, so that a
// configuration that cannot work is refused at once, with the fix, rather
// than failing later ("database is locked") or losing data silently.
//
// What the module needs from SQLite, and why (docs/operations.md, SQLite):
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
//   - WAL, for a file database. Constructors switch a database in a
//     rollback-journal mode to WAL (persistently, see ensureWAL): without
//     it, readers and writers hold each other back, and under load writers
//     wait out the busy timeout and fail.
//
// The transaction mode is not needed: every write transaction of the
// module writes first, so SQLite's busy handler applies and no transaction
// has to upgrade a read lock.
package sqliteconf

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Settings is what Check read of a SQLite handle.
type Settings struct {
	// File is the main database's full path, "" for a private in-memory
	// database.
	File string
	// BusyTimeout is how long a connection of the handle waits for
	// SQLite's write lock.
	BusyTimeout time.Duration
}

// Check returns an error naming the setting and its fix when db (a SQLite
// handle on pool) cannot be used by the module's stores, and otherwise
// the handle's Settings. constructor names the caller in the message.
func Check(ctx context.Context, db *gorm.DB, pool *sql.DB, constructor string) (s Settings, err error) {
	db = db.WithContext(ctx)
	var timeouts []int64
	if err := db.Raw("PRAGMA busy_timeout").Scan(&timeouts).Error; err != nil {
		return s, fmt.Errorf("%s: read SQLite busy_timeout: %w", constructor, err)
	}
	if len(timeouts) == 1 {
		s.BusyTimeout = time.Duration(timeouts[0]) * time.Millisecond
	}
	if len(timeouts) == 1 && timeouts[0] <= 0 {
		return s, fmt.Errorf("%s: the SQLite connection has busy_timeout 0, so writers waiting for a batch would fail with \"database is locked\": "+
			"leave the driver's default (5 s) or set one in the DSN (_busy_timeout=10000 for gorm.io/driver/sqlite, _pragma=busy_timeout(10000) for github.com/glebarez/sqlite)", constructor)
	}
	file, err := MainFile(db)
	if err != nil {
		return s, fmt.Errorf("%s: locate the SQLite database file: %w", constructor, err)
	}
	s.File = file
	inMemory := file == ""
	if !inMemory {
		if err := ensureWAL(db, constructor); err != nil {
			return s, err
		}
	}
	if max := pool.Stats().MaxOpenConnections; inMemory && max != 1 {
		limit := "no limit"
		if max > 1 {
			limit = fmt.Sprintf("up to %d", max)
		}
		return s, fmt.Errorf("%s: the SQLite database is in memory and the pool may open more than one connection (%s): "+
			"a private in-memory database is a different, empty database on each connection, so acknowledged appends would be lost; "+
			"call SetMaxOpenConns(1) on the pool (db.DB()) before constructing the stores, or use a database file", constructor, limit)
	}
	return s, nil
}

// MainFile returns the full path of the main database file behind db (a
// SQLite handle or transaction), "" for a private in-memory database.
func MainFile(db *gorm.DB) (string, error) {
	var file string
	err := db.Raw("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file).Error
	return file, err
}

// ensureWAL switches a file database that is in a rollback-journal mode to
// WAL. The setting is the database file's, persistent, and the one the
// README recommends: in a rollback-journal mode every reader holds the
// committing writer back and the writer every new reader, and under load
// (measured with github.com/glebarez/sqlite and the drivers' default 5 s
// busy timeout: 8 appenders and a reader) writers then wait out the busy
// timeout and fail with "database is locked". A database that cannot be
// switched (a file system without shared memory, another connection
// holding it) is refused with the fix.
func ensureWAL(db *gorm.DB, constructor string) error {
	var modes []string
	if err := db.Raw("PRAGMA journal_mode").Scan(&modes).Error; err != nil {
		return fmt.Errorf("%s: read SQLite journal_mode: %w", constructor, err)
	}
	if len(modes) != 1 || strings.EqualFold(modes[0], "wal") {
		return nil
	}
	modes = nil
	if err := db.Raw("PRAGMA journal_mode = WAL").Scan(&modes).Error; err != nil || len(modes) != 1 || !strings.EqualFold(modes[0], "wal") {
		got := "unknown"
		if len(modes) == 1 {
			got = modes[0]
		}
		return fmt.Errorf("%s: the SQLite database is in journal_mode %s and could not be switched to WAL (result %s, error %v): "+
			"open it in WAL mode (_journal_mode=WAL for gorm.io/driver/sqlite, _pragma=journal_mode(WAL) for github.com/glebarez/sqlite)",
			constructor, got, got, err)
	}
	return nil
}
