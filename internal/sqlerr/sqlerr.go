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
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// Unique is a unique or primary-key violation as the database reported
// it.
type Unique struct {
	// Constraint names what was violated: the constraint on Postgres
	// ("events_pkey"), the columns on SQLite ("events.id"); "" when
	// gorm.Config.TranslateError dropped the database's message.
	Constraint string
	// Detail is Postgres' DETAIL line (the key and its value); "" on
	// SQLite, whose message has no more than the columns.
	Detail string
}

// UniqueViolation reports whether err is a unique or primary-key
// violation, and what the database says about it.
func UniqueViolation(err error) (violation Unique, unique bool) {
	if err == nil {
		return Unique{}, false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code != "23505" {
			return Unique{}, false
		}
		return Unique{Constraint: pgErr.ConstraintName, Detail: pgErr.Detail}, true
	}
	msg := err.Error()
	for _, marker := range []string{"UNIQUE constraint failed: ", "PRIMARY KEY constraint failed: "} {
		if i := strings.Index(msg, marker); i >= 0 {
			columns := strings.TrimSpace(msg[i+len(marker):])
			// modernc.org/sqlite appends the extended code: " (1555)".
			if j := strings.LastIndex(columns, " ("); j > 0 && strings.HasSuffix(columns, ")") {
				columns = columns[:j]
			}
			return Unique{Constraint: columns}, true
		}
	}
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		return Unique{}, true
	}
	return Unique{}, false
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

// SQLState returns the SQLSTATE of a Postgres error anywhere in err's
// chain, or "" when there is none.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// CommitRolledBack reports whether err is pgx's report of a COMMIT that
// Postgres turned into a rollback because the transaction had failed.
func CommitRolledBack(err error) bool {
	return errors.Is(err, pgx.ErrTxCommitRollback)
}

// SQLite primary result codes (https://sqlite.org/rescode.html) that
// callers branch on.
const (
	SQLiteConstraint = 19 // SQLITE_CONSTRAINT: a constraint was violated
)

// SQLiteCode returns the result code of a SQLite error anywhere in err's
// chain, from any driver, without importing one: modernc.org/sqlite and
// github.com/glebarez/go-sqlite report it through a Code() int method,
// github.com/mattn/go-sqlite3 in the Code and ExtendedCode fields of its
// Error struct, which are read by reflection. Only error types declared
// in a package whose path contains "sqlite" are asked, so that another
// library's Code method is never taken for SQLite's. The code is the
// extended one where the driver gives it; primary is its low byte. ok is
// false when no SQLite error is in the chain.
func SQLiteCode(err error) (code int, primary int, ok bool) {
	for _, e := range chain(err) {
		if c, found := sqliteCode(e); found {
			return c, c & 0xff, true
		}
	}
	return 0, 0, false
}

func sqliteCode(e error) (int, bool) {
	v := reflect.ValueOf(e)
	t := v.Type()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if !strings.Contains(t.PkgPath(), "sqlite") {
		return 0, false
	}
	if c, ok := e.(interface{ Code() int }); ok {
		return c.Code(), true
	}
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return 0, false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return 0, false
	}
	for _, name := range []string{"ExtendedCode", "Code"} {
		f := v.FieldByName(name)
		if f.IsValid() && f.CanInt() && f.Int() != 0 {
			return int(f.Int()), true
		}
	}
	return 0, false
}

// chain lists err and every error it wraps, depth first (errors.Join and
// fmt.Errorf with several %w included).
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil || len(out) > 64 {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, w := range u.Unwrap() {
				walk(w)
			}
		}
	}
	walk(err)
	return out
}

// SQLiteConstraintViolation reports whether err is a SQLite constraint
// violation (SQLITE_CONSTRAINT and its extended codes: unique, primary
// key, foreign key, check, not null, a trigger's RAISE(ABORT|FAIL)), by
// its result code, never by its text.
func SQLiteConstraintViolation(err error) bool {
	_, primary, ok := SQLiteCode(err)
	return ok && primary == SQLiteConstraint
}
