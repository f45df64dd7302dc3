// Package dsn is the one home of the DSNs this module's tests, example and
// benchmark program open: the Postgres server they share (from the
// environment) and the SQLite file DSN the README documents. It imports no
// test packages, so commands may use it.
package dsn

import "os"

const (
	// PostgresEnv names the variable holding the Postgres DSN for tests,
	// the example's defaults and cmd/subbench.
	PostgresEnv = "SUBSCRIPTIONS_POSTGRES_DSN"
	// DefaultPostgres is used when PostgresEnv is unset.
	DefaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

// Postgres returns the configured base Postgres DSN.
func Postgres() string {
	if v := os.Getenv(PostgresEnv); v != "" {
		return v
	}
	return DefaultPostgres
}

// SQLiteFile is the DSN this module documents for a SQLite file database:
// WAL so readers never block the writer, a busy timeout so writers queue
// instead of failing, and immediate transactions so that a transaction never
// has to upgrade a read lock (which SQLite refuses with "database is
// locked" instead of waiting).
func SQLiteFile(path string) string {
	return "file:" + path + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate&_foreign_keys=1"
}

// SQLiteFileGlebarez is SQLiteFile for github.com/glebarez/sqlite (pure Go),
// which ignores the cgo driver's parameters and takes pragmas instead.
func SQLiteFileGlebarez(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate&_pragma=foreign_keys(1)"
}
