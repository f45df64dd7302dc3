//go:build !cgo

package main

import (
	"github.com/glebarez/sqlite"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dsn"
)

// sqliteDriver: see sqlite_cgo.go.
const sqliteDriver = "github.com/glebarez/sqlite (pure Go)"

func openSQLite(dsn string) gorm.Dialector { return sqlite.Open(dsn) }

func sqliteFileDSN(path string) string { return dsn.SQLiteFileGlebarez(path) }
