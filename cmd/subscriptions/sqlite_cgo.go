//go:build cgo

package main

import (
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dsn"
)

// sqliteDriver names the SQLite driver this build opens files with: the
// cgo driver (gorm.io/driver/sqlite) when cgo is available, the pure-Go one
// (sqlite_purego.go) otherwise, so a CGO_ENABLED=0 static binary still
// reads SQLite files. A "file:" DSN given by the user is passed to it as
// is, so it must use that driver's parameters.
const sqliteDriver = "gorm.io/driver/sqlite (cgo)"

func openSQLite(dsn string) gorm.Dialector { return sqlite.Open(dsn) }

func sqliteFileDSN(path string) string { return dsn.SQLiteFile(path) }
