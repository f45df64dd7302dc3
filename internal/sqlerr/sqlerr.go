// Package sqlerr classifies database errors without importing a database
// driver, so that the library builds with CGO_ENABLED=0 and never links a
// SQLite driver the application did not choose.
//
// Postgres errors are recognised through pgconn.PgError (pgx is the
// driver gorm.io/driver/postgres uses, and is pure Go). SQLite errors are
// recognised by their message, which SQLite itself writes and every driver
// passes through ("UNIQUE constraint failed: events.id" from
// github.com/mattn/go-sqlite3 and modernc.org/sqlite alike), or by GORM's
// gorm.ErrDuplicatedKey when the application opened the database with
// gorm.Config.TranslateError (the message is then gone, see
// UniqueViolation's detail result).
package sqlerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// UniqueViolation reports whether err is a unique or primary-key
// violation. detail is what the database says about it (the constraint or
// the columns), "" when a translation dropped it.
func UniqueViolation(err error) (unique bool, detail string) {
	if err == nil {
		return false, ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code != "23505" {
			return false, ""
		}
		return true, pgErr.ConstraintName + ": " + pgErr.Detail
	}
	msg := err.Error()
	for _, marker := range []string{"UNIQUE constraint failed: ", "PRIMARY KEY constraint failed: "} {
		if i := strings.Index(msg, marker); i >= 0 {
			detail = strings.TrimSpace(msg[i+len(marker):])
			// modernc.org/sqlite appends the extended code: " (1555)".
			if j := strings.LastIndex(detail, " ("); j > 0 && strings.HasSuffix(detail, ")") {
				detail = detail[:j]
			}
			return true, detail
		}
	}
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return true, ""
	}
	return false, ""
}

// Busy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED
// ("database is locked", "database table is locked"), by message, from
// any driver.
func Busy(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "database table is locked") ||
		strings.Contains(msg, "SQLITE_BUSY")
}
