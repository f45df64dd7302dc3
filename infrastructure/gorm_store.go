package infrastructure

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/dialect"
	"github.com/eventfeed/subscriptions/internal/eventrow"
	"github.com/eventfeed/subscriptions/internal/pgxconn"
	"github.com/eventfeed/subscriptions/internal/sqlerr"
	"github.com/eventfeed/subscriptions/internal/sqliteconf"
	"github.com/eventfeed/subscriptions/internal/sqlitequeue"
	"github.com/eventfeed/subscriptions/migrations"
)

// GormEventStore is a domain.EventStore on Postgres or SQLite through GORM.
// It is safe for concurrent use, by any number of processes on Postgres.
//
// # The ordered feed
//
// ReadAfter is a durable queue: a subscriber stores the last position it
// handled and never looks below it again, so a position must never become
// visible while a smaller one can still commit. Positions drawn from a
// sequence become visible in commit order, not position order, so on
// Postgres every append takes a transaction-scoped advisory lock (its key
// derived from the events table's schema-qualified name) before its rows
// take positions. Appends to one events table therefore commit one at a
// time, in position order, and ReadAfter is a plain index range scan that
// nothing but an in-flight append can delay: unrelated transactions, long
// or not, never hold the feed back. The price is that appends to one table
// are serialized, the lock held through each commit's WAL flush. Within
// one process, concurrent appends that wait for the lock at the same time
// share one transaction, so they share the lock and the flush while each
// keeps its own version check and outcome; cmd/subbench scenario 7
// measures both, and docs/appends.md explains the choice. The pipelined
// append and its coalescing are pgevents.Appender, which
// pgxstore.EventStore runs too.
//
// # Transactions
//
// Built on a caller's transaction (db.Begin(), or the tx of
// db.Transaction), the store runs every statement in it: Append joins the
// transaction (a savepoint), and its events, the append lock and the
// NOTIFY take effect at the caller's commit, or vanish at its rollback.
// This is the unit of work: the application's state change and its events
// commit together. On Postgres the transaction must be READ COMMITTED
// (other levels are refused, see appendOnce), and it holds the append
// lock from its first Append to its end, delaying every other append to
// the table meanwhile: keep such transactions short.
//
// On SQLite, writers are serialized by the database itself and positions
// are MAX(position)+1 inside the write transaction, which takes the write
// lock with its first statement (no read lock to upgrade, whatever the
// DSN's transaction mode). The appends and subscribers' batches of one
// process on one database file take turns in arrival order, whichever
// store they go through, so that none waits out the busy timeout while
// the others proceed (internal/sqlitequeue); each then waits for other
// writers (another process) for at most the busy timeout.
// NewGormEventStore refuses a SQLite handle that could not keep that
// promise and switches a file database to WAL (internal/sqliteconf,
// README). Any GORM SQLite driver works: none is imported.
//
// On Postgres each append also runs pg_notify(channel, ”) in its
// transaction, delivered at commit, for subscriptions' PostgresListener;
// the channel is PostgresNotifyChannel unless WithNotifyChannel says
// otherwise.
type GormEventStore struct {
	db   *gorm.DB
	pool *sql.DB // Postgres: for the pipelined append; nil on a caller's transaction
	// inTx: db is a caller's transaction, which every statement joins.
	inTx bool
	// portableOnly disables the pipelined append and the pgx reads
	// (tests of the portable paths).
	portableOnly bool
	notPgx       atomic.Bool // the pool's driver is not pgx: portable path
	dialect      *dialect.Dialect
	lockKey      int64  // Postgres: the append lock's key (table.LockKey)
	schema       string // WithSchema's; "" for the search_path's
	events       string // the events table as the statements name it
	// table is the events table, resolved (Postgres only: the append
	// lock, ProbeHeads).
	table   pgevents.Table
	channel string // Postgres: the NOTIFY channel
	// appender runs the pipelined append (and coalesces it); nil without
	// pool.
	appender *pgevents.Appender
	// queue orders this process's appends to the SQLite file, each
	// waiting at most busy for the queue to move (sqlitequeue); nil on
	// Postgres and on a caller's transaction, which may hold the write
	// lock already.
	queue *sqlitequeue.Queue
	busy  time.Duration
}

var _ domain.EventStore = (*GormEventStore)(nil)

// NewGormEventStore applies the module's schema migrations if the database
// lacks any (migrations.Migrate: the events table and the subscriptions
// tables beside it) and returns a store. Construction is safe while other
// processes append: it takes no lock when the schema is up to date, and
// concurrent constructors take turns. With WithSchemaVerifyOnly it runs
// no DDL and fails, wrapping migrations.ErrSchemaMismatch, when the schema
// is not complete (or on a handle marked by migrations.VerifyOnly).
// Dialects other than Postgres and SQLite are refused with an error
// wrapping domain.ErrGlobalOrderingNotSupported.
//
// Every call holds one connection of db's pool at a time; concurrent
// appends of one store share one (coalesced), so a pool of any size
// works (subscriptions' documentation, Connections, gives the budget).
func NewGormEventStore(db *gorm.DB, opts ...GormEventStoreOption) (*GormEventStore, error) {
	if db == nil || db.Config == nil || db.Dialector == nil {
		return nil, errors.New("infrastructure: NewGormEventStore: nil or unopened *gorm.DB (use gorm.Open)")
	}
	d := dialect.Of(db)
	if d == nil {
		return nil, fmt.Errorf("infrastructure: NewGormEventStore: dialect %q: %w (use postgres or sqlite)", db.Name(), domain.ErrGlobalOrderingNotSupported)
	}
	cfg, err := newGormEventStoreConfig(opts)
	if err != nil {
		return nil, fmt.Errorf("infrastructure: NewGormEventStore: %w", err)
	}
	ctx := context.Background()
	if cfg.schemaSet && !d.AdvisoryLocks {
		return nil, fmt.Errorf("infrastructure: NewGormEventStore: WithSchema(%q): %s has no schemas; give each tenant a database file of its own", cfg.schema, db.Name())
	}
	var sqlite sqliteconf.Settings
	if d == dialect.SQLite {
		pool, err := db.DB()
		if err != nil {
			return nil, fmt.Errorf("infrastructure: NewGormEventStore: %w", err)
		}
		if sqlite, err = sqliteconf.Check(ctx, db, pool, "infrastructure: NewGormEventStore"); err != nil {
			return nil, err
		}
	}
	if err = migrations.EnsureSchema(ctx, db, cfg.schema, cfg.verifyOnly); err != nil {
		return nil, fmt.Errorf("infrastructure: NewGormEventStore: %w", err)
	}
	s := &GormEventStore{db: db, dialect: d, inTx: inTransaction(db), channel: cfg.channel,
		schema: cfg.schema, events: pgevents.TableName(cfg.schema)}
	if d == dialect.SQLite && !s.inTx {
		s.queue, s.busy = sqlitequeue.For(sqlite.File), sqlite.BusyTimeout
	}
	if d.AdvisoryLocks {
		// The lock key derives from the table's canonical name, so that
		// every store of the table takes one lock however it names it.
		var qualified string
		err := db.WithContext(ctx).Raw(strings.Replace(pgevents.TableQuery, "$1", "?", 1), s.events).Scan(&qualified).Error
		if err == nil {
			s.table, err = pgevents.NewTable(s.schema, qualified)
		}
		if err != nil {
			return nil, fmt.Errorf("infrastructure: NewGormEventStore: resolve the events table: %w", err)
		}
		s.lockKey = s.table.LockKey()
	}
	// On a caller's transaction every append must join it: the pipelined
	// path would take a connection of its own and commit outside it.
	if d.Pipelines && !s.inTx {
		if pool, err := db.DB(); err == nil {
			s.pool = pool
			s.appender = pgevents.NewAppender(s.table, s.channel, s.withPgxConn)
		}
	}
	return s, nil
}

// Append stores events for one aggregate atomically; see domain.EventStore.
// Nothing is stored when any event is invalid or the version check fails.
// Sequence numbers are assigned or checked as domain.EventStore.Append
// says, inside the append's transaction. It keeps no reference to events
// once it returns, even when it gives up on an append that may still
// commit: the caller may reuse them.
func (s *GormEventStore) Append(ctx context.Context, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	// Validate what can be checked without the database first, so bad
	// input never takes the append lock. The aggregate's version is not
	// known yet (-1): the version check and sequence numbers are checked
	// again inside the transaction.
	given, err := pgevents.PrepareAppend(aggregateID, expectedVersion, -1, events)
	if err != nil {
		return err
	}
	if len(events) == 0 {
		// Nothing to store, but the version check is still answered, as
		// MemoryStore answers it.
		if expectedVersion == -1 {
			return nil
		}
		current, err := s.GetCurrentVersion(ctx, aggregateID)
		if err != nil {
			return err
		}
		_, err = pgevents.PrepareAppend(aggregateID, expectedVersion, current, nil)
		return err
	}
	// The pipelined Postgres path when the pool is pgx's (the
	// gorm.io/driver/postgres default), the portable one otherwise.
	if s.appender != nil && !s.portableOnly && !s.notPgx.Load() {
		err := s.appender.Append(ctx, aggregateID, expectedVersion, events, given)
		if !errors.Is(err, errNotPgx) {
			return err
		}
		s.notPgx.Store(true)
	}
	err = s.appendOnce(ctx, aggregateID, expectedVersion, events, s.dialect.Notify)
	if s.dialect.Notify && pgevents.IsNotifyFailure(err) {
		// A full notification queue must not fail the append: notifications
		// are wake-ups, and subscribers poll anyway. (On a caller's
		// transaction the NOTIFY is queued until the caller's COMMIT, which
		// the full queue then fails: see docs/appends.md.)
		err = s.appendOnce(ctx, aggregateID, expectedVersion, events, false)
	}
	return err
}

// inTransaction reports a *gorm.DB bound to a transaction (db.Begin(), or
// the tx of db.Transaction): its statements run in that transaction.
func inTransaction(db *gorm.DB) bool {
	if db.Statement == nil {
		return false
	}
	committer, ok := db.Statement.ConnPool.(gorm.TxCommitter)
	return ok && committer != nil
}

const insertColumns = " (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at) VALUES "

// insertChunk keeps one INSERT under Postgres's 65535 bind parameters.
const insertChunk = 1000

// insertStatement is one multi-row INSERT and its arguments.
type insertStatement struct {
	sql  string
	args []any
}

// insertStatements builds the INSERTs into table for prepared events
// whose positions follow head, insertChunk rows at a time. numbered selects Postgres's $n
// placeholders (for pgx) instead of GORM's ?; jsonb casts the JSON columns.
func insertStatements(table string, prepared []pgevents.Prepared, head int64, jsonb, numbered bool) []insertStatement {
	var out []insertStatement
	for start := 0; start < len(prepared); start += insertChunk {
		end := min(start+insertChunk, len(prepared))
		var q strings.Builder
		q.WriteString("INSERT INTO " + table + insertColumns)
		args := make([]any, 0, 9*(end-start))
		for i, p := range prepared[start:end] {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(")
			for col := 1; col <= 9; col++ {
				if col > 1 {
					q.WriteString(", ")
				}
				if numbered {
					q.WriteString("$" + strconv.Itoa(len(args)+col))
				} else {
					q.WriteString("?")
				}
				if jsonb && (col == 7 || col == 8) {
					q.WriteString("::jsonb")
				}
			}
			q.WriteString(")")
			e := p.Envelope
			args = append(args, e.ID, e.AggregateID, e.EventType, e.SequenceNo, e.TransactionID,
				head+int64(start+i+1), string(p.Payload), string(p.Metadata), e.Created)
		}
		out = append(out, insertStatement{sql: q.String(), args: args})
	}
	return out
}

func (s *GormEventStore) appendOnce(ctx context.Context, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], notify bool) error {
	// On Postgres the append relies on READ COMMITTED: the statement after
	// the lock must see every append committed before the lock was granted.
	// Under a stricter default_transaction_isolation the snapshot would be
	// taken before the lock (duplicate positions), or appends would fail
	// with serialization errors, so the level is set explicitly (dialect.TxOptions).
	if s.queue != nil {
		done, err := s.queue.Wait(ctx, s.busy)
		if err != nil {
			return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(events), aggregateID, err)
		}
		defer done()
	}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if show, readCommitted := s.dialect.ShowIsolation(); s.inTx && show != "" {
			// The caller's transaction chose its isolation level. Only READ
			// COMMITTED reads, after the lock, every append committed
			// before it; under a snapshot taken earlier the append would
			// reuse a committed position and fail.
			var level string
			if err := tx.Raw(show).Scan(&level).Error; err != nil {
				return fmt.Errorf("read the transaction's isolation level: %w", err)
			}
			if level != readCommitted {
				return fmt.Errorf("the caller's transaction runs at isolation level %q; appending inside a transaction needs READ COMMITTED (begin it with &sql.TxOptions{Isolation: sql.LevelReadCommitted})", level)
			}
		}
		lock, args, what := s.dialect.WriteLock(s.lockKey)
		if err := tx.Exec(lock, args...).Error; err != nil {
			return fmt.Errorf("take %s: %w", what, err)
		}
		// In its own statement, after the lock: its snapshot then includes
		// every append that committed before ours took the lock.
		var heads struct {
			Version  int
			Position int64
		}
		if err := tx.Raw(`SELECT
			(SELECT COALESCE(MAX(sequence_no), 0) FROM `+s.events+` WHERE aggregate_id = ?) AS version,
			(SELECT COALESCE(MAX(position), 0) FROM `+s.events+`) AS position`, aggregateID).Scan(&heads).Error; err != nil {
			return fmt.Errorf("read versions: %w", err)
		}
		stored, err := lookupStored(tx, s.events, events)
		if err != nil {
			return err
		}
		if len(stored) > 0 {
			given, err := pgevents.PrepareAppend(aggregateID, expectedVersion, -1, events)
			if err != nil {
				return err
			}
			if err := pgevents.CheckStoredIDs(aggregateID, expectedVersion, events, given, stored); err != nil {
				return err
			}
		}
		prepared, err := pgevents.PrepareAppend(aggregateID, expectedVersion, heads.Version, events)
		if err != nil {
			return err
		}
		for _, chunk := range insertStatements(s.events, prepared, heads.Position, s.dialect.JSONB, false) {
			if err := tx.Exec(chunk.sql, chunk.args...).Error; err != nil {
				err = s.insertError(aggregateID, err)
				if s.dialect == dialect.SQLite {
					err = duplicateIDError(tx, aggregateID, prepared, err) // SQLite: the bare table
				}
				return err
			}
		}
		if notify {
			if err := tx.Exec("SELECT pg_notify(?, '')", s.channel).Error; err != nil {
				if !pgevents.IsNotifyFailure(err) { // a lost connection, a cancellation
					return fmt.Errorf("notify subscribers: %w", err)
				}
				return pgevents.NotifyError{Err: err}
			}
		}
		return nil
	}, s.dialect.TxOptionsList()...)
	if err == nil || errors.Is(err, domain.ErrInvalidEvent) || errors.Is(err, domain.ErrConcurrencyConflict) ||
		errors.Is(err, domain.ErrAlreadyAppended) || errors.As(err, new(pgevents.NotifyError)) {
		return err
	}
	return fmt.Errorf("append %d event(s) to aggregate %q: %w", len(events), aggregateID, err)
}

// lookupStored reads, inside the append's transaction, the stored events
// of table among the append's event IDs, for pgevents.CheckStoredIDs.
func lookupStored(tx *gorm.DB, table string, events []domain.EventEnvelope[any]) (map[string]pgevents.Stored, error) {
	stored := map[string]pgevents.Stored{}
	for start := 0; start < len(events); start += insertChunk {
		ids := make([]string, 0, insertChunk)
		for _, ev := range events[start:min(start+insertChunk, len(events))] {
			ids = append(ids, ev.ID)
		}
		var rows []GormEventModel
		if err := tx.Raw("SELECT id, aggregate_id, event_type, transaction_id, sequence_no, payload FROM "+table+" WHERE id IN ?", ids).Scan(&rows).Error; err != nil {
			return nil, fmt.Errorf("read stored event IDs: %w", err)
		}
		for _, r := range rows {
			stored[r.ID] = pgevents.Stored{ID: r.ID, AggregateID: r.AggregateID, EventType: r.EventType,
				TransactionID: r.TransactionID, SequenceNo: r.SequenceNo, Payload: r.Payload}
		}
	}
	return stored, nil
}

// insertError maps unique violations to the domain's errors, from any
// driver: Postgres's as pgevents.InsertError maps them for both Postgres
// stores, SQLite's (and those gorm.Config.TranslateError stripped of
// their detail) classified by internal/sqlerr: no driver is imported.
func (s *GormEventStore) insertError(aggregateID string, err error) error {
	if errors.As(err, new(*pgconn.PgError)) {
		return pgevents.InsertError(aggregateID, err)
	}
	violation, unique := sqlerr.UniqueViolation(err)
	if !unique {
		return fmt.Errorf("insert events: %w", err)
	}
	switch violation.Constraint {
	case "events.id": // SQLite
		return fmt.Errorf("%w: aggregate %q: an event ID is already stored", domain.ErrInvalidEvent, aggregateID)
	case "":
		// gorm.Config.TranslateError dropped the detail: the caller
		// tells an ID clash from a version clash (duplicateIDError).
		return fmt.Errorf("%w: aggregate %q: %w", domain.ErrConcurrencyConflict, aggregateID, errUndetailed)
	}
	return fmt.Errorf("%w: aggregate %q: UNIQUE constraint failed: %s", domain.ErrConcurrencyConflict, aggregateID, violation.Constraint)
}

// errUndetailed marks a unique violation whose constraint is unknown.
var errUndetailed = errors.New("unique constraint violated")

// duplicateIDError replaces an undetailed unique violation by
// ErrInvalidEvent when one of the events' IDs is already stored. tx is the
// append's SQLite transaction, still usable after a failed statement.
func duplicateIDError(tx *gorm.DB, aggregateID string, prepared []pgevents.Prepared, err error) error {
	if !errors.Is(err, errUndetailed) {
		return err
	}
	ids := make([]string, len(prepared))
	for i, p := range prepared {
		ids[i] = p.Envelope.ID
	}
	var n int64
	if qerr := tx.Raw("SELECT count(*) FROM events WHERE id IN ?", ids).Scan(&n).Error; qerr != nil || n == 0 {
		return err
	}
	return fmt.Errorf("%w: aggregate %q: an event ID is already stored", domain.ErrInvalidEvent, aggregateID)
}

// query reads whole events: Select followed by clause (GORM's ?
// placeholders) with args; limit is the read's LIMIT, 0 for none.
func (s *GormEventStore) query(ctx context.Context, what string, limit int, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	events, done, err := s.queryPgx(ctx, limit, clause, args)
	if !done {
		events, err = eventrow.ReadFrom(ctx, s.db, s.events, clause, args...)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return events, nil
}

// queryPgx is query straight on a pooled connection's pgx session, when
// the pool is pgx's (the gorm.io/driver/postgres default): the rows are
// scanned into envelopes with reused buffers (pgevents.ReadEnvelopes),
// where GORM's scan into rows took twice the time and two and a half
// times the allocations per event (BenchmarkPostgresReadAfter). The
// statement is the same, outside any transaction as through the pool.
// done is false when it did not run: on SQLite, on a caller's
// transaction, on another driver, or in the portable mode of the tests.
func (s *GormEventStore) queryPgx(ctx context.Context, limit int, clause string, args []any) (events []domain.EventEnvelope[any], done bool, err error) {
	if s.pool == nil || s.portableOnly || s.notPgx.Load() {
		return nil, false, nil
	}
	conn, err := s.pool.Conn(ctx)
	if err != nil {
		return nil, true, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		pc, ok := pgxconn.Unwrap(dc)
		if !ok {
			return nil
		}
		done = true
		// A connection the read broke is discarded by database/sql when
		// it is handed back (pgx's driver reports it invalid).
		rows, err := pc.Query(ctx, eventrow.SelectFrom(s.events)+numberedPlaceholders(clause), args...)
		if err != nil {
			return err
		}
		events, err = pgevents.ReadEnvelopes(rows, limit)
		return err
	})
	if !done && err == nil {
		s.notPgx.Store(true) // the append path's test too
	}
	return events, done, err
}

// numberedPlaceholders rewrites the ? placeholders of a query clause as
// pgx's $1, $2, ...; the clauses have no ? elsewhere.
func numberedPlaceholders(clause string) string {
	var b strings.Builder
	n := 0
	for _, r := range clause {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// GetEvents returns every event of the aggregate in sequence order.
func (s *GormEventStore) GetEvents(ctx context.Context, aggregateID string) ([]domain.EventEnvelope[any], error) {
	return s.GetEventsRange(ctx, aggregateID, -1, -1)
}

// GetEventsFromVersion returns the aggregate's events with sequence number
// >= fromVersion (-1 means 1).
func (s *GormEventStore) GetEventsFromVersion(ctx context.Context, aggregateID string, fromVersion int) ([]domain.EventEnvelope[any], error) {
	return s.GetEventsRange(ctx, aggregateID, fromVersion, -1)
}

// GetEventsRange returns the aggregate's events with sequence numbers in
// [fromVersion, toVersion]; -1 means 1 for fromVersion and "to the end" for
// toVersion.
func (s *GormEventStore) GetEventsRange(ctx context.Context, aggregateID string, fromVersion, toVersion int) ([]domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return nil, err
	}
	from, to, err := pgevents.CheckVersionRange(aggregateID, fromVersion, toVersion)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("read aggregate %q versions %d..%d", aggregateID, fromVersion, toVersion)
	if to < 0 {
		return s.query(ctx, what, 0, "WHERE aggregate_id = ? AND sequence_no >= ? ORDER BY sequence_no", aggregateID, from)
	}
	return s.query(ctx, what, 0, "WHERE aggregate_id = ? AND sequence_no BETWEEN ? AND ? ORDER BY sequence_no", aggregateID, from, to)
}

// GetEventByID returns one event or an error wrapping
// domain.ErrEventNotFound.
func (s *GormEventStore) GetEventByID(ctx context.Context, eventID string) (domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("event ID", eventID); err != nil {
		return domain.EventEnvelope[any]{}, err
	}
	events, err := s.query(ctx, fmt.Sprintf("read event %q", eventID), 1, "WHERE id = ?", eventID)
	if err != nil {
		return domain.EventEnvelope[any]{}, err
	}
	if len(events) == 0 {
		return domain.EventEnvelope[any]{}, fmt.Errorf("%w: event ID %q", domain.ErrEventNotFound, eventID)
	}
	return events[0], nil
}

// GetEventsByTransactionID returns the transaction's events ordered by
// aggregate ID, then sequence number.
func (s *GormEventStore) GetEventsByTransactionID(ctx context.Context, transactionID string) ([]domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("transaction ID", transactionID); err != nil {
		return nil, err
	}
	// Aggregate IDs sort by their bytes, as in MemoryStore, whatever the
	// database's collation (SQLite's default, BINARY, already does).
	order := "ORDER BY aggregate_id" + s.dialect.Bytewise() + ", sequence_no"
	return s.query(ctx, fmt.Sprintf("read transaction %q", transactionID), 0,
		"WHERE transaction_id = ? "+order, transactionID)
}

// GetCurrentVersion returns the aggregate's last sequence number, 0 when it
// does not exist.
func (s *GormEventStore) GetCurrentVersion(ctx context.Context, aggregateID string) (int, error) {
	if err := pgevents.CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return 0, err
	}
	var version int
	if err := s.db.WithContext(ctx).Raw("SELECT COALESCE(MAX(sequence_no), 0) FROM "+s.events+" WHERE aggregate_id = ?", aggregateID).Scan(&version).Error; err != nil {
		return 0, fmt.Errorf("read version of aggregate %q: %w", aggregateID, err)
	}
	return version, nil
}

// ReadAfter returns up to limit committed events (all when limit <= 0) with
// Position > afterPosition, in position order: an index range scan that
// only an in-flight append can delay (see the type's documentation).
func (s *GormEventStore) ReadAfter(ctx context.Context, afterPosition int64, limit int) ([]domain.EventEnvelope[any], error) {
	what := fmt.Sprintf("read feed after position %d", afterPosition)
	if limit > 0 {
		return s.query(ctx, what, limit, "WHERE position > ? ORDER BY position LIMIT ?", afterPosition, limit)
	}
	return s.query(ctx, what, 0, "WHERE position > ? ORDER BY position", afterPosition)
}

// HeadPosition returns the highest committed position, 0 when empty.
func (s *GormEventStore) HeadPosition(ctx context.Context) (int64, error) {
	var head int64
	if err := s.db.WithContext(ctx).Raw("SELECT COALESCE(MAX(position), 0) FROM " + s.events).Scan(&head).Error; err != nil {
		return 0, fmt.Errorf("read feed head: %w", err)
	}
	return head, nil
}

// ProbeHeads returns the feed head of each of stores (what each one's
// HeadPosition would return), read in one statement on this store's
// connection pool: subscriptions.Group's probe of the tenants of one
// database (subscriptions.HeadProber), which costs one index lookup per
// store and one connection at a time, however many stores there are.
//
// It needs Postgres, and stores that are GormEventStores on Postgres on
// this store's database (each names its events table schema-qualified,
// as resolved by NewGormEventStore): the statement reads each table
// through this store's connection. Any other store, or SQLite, is an
// error wrapping errors.ErrUnsupported, and the caller then asks each
// store on its own. A store of another database whose schema this one
// lacks fails the statement (the relation does not exist). Safe for
// concurrent use.
func (s *GormEventStore) ProbeHeads(ctx context.Context, stores []domain.EventStore) ([]int64, error) {
	if s.table.Qualified() == "" {
		return nil, fmt.Errorf("infrastructure: probe heads: dialect %q: %w", s.db.Name(), errors.ErrUnsupported)
	}
	tables := make([]string, len(stores))
	for i, store := range stores {
		g, ok := store.(*GormEventStore)
		if !ok || g == nil || g.table.Qualified() == "" {
			return nil, fmt.Errorf("infrastructure: probe heads: store %d (%T) is not a GormEventStore on Postgres: %w", i, store, errors.ErrUnsupported)
		}
		tables[i] = g.table.Qualified()
	}
	if len(tables) == 0 {
		return nil, nil
	}
	rows, err := s.db.WithContext(ctx).Raw(pgevents.HeadsQuery(tables)).Rows()
	if err != nil {
		return nil, fmt.Errorf("infrastructure: probe heads of %d stores: %w", len(tables), err)
	}
	defer rows.Close()
	heads, err := pgevents.ScanHeads(len(tables), rows.Next, rows.Scan)
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("infrastructure: probe heads of %d stores: %w", len(tables), err)
	}
	return heads, nil
}

func init() {
	// The subscriptions package asks through eventrow, not an exported
	// accessor, which database a store reads (see eventrow.StoreDB).
	eventrow.RegisterStoreDB(func(store domain.EventStore) (*gorm.DB, bool) {
		s, ok := store.(*GormEventStore)
		if !ok || s == nil {
			return nil, false
		}
		return s.db, true
	})
	// And which schema it names (WithSchema), which a checkpoint store
	// must name too to share its feed (eventrow.StoreSchema).
	eventrow.RegisterStoreSchema(func(store domain.EventStore) string {
		if s, ok := store.(*GormEventStore); ok && s != nil {
			return s.schema
		}
		return ""
	})
}

// Close is a no-op: the *gorm.DB belongs to the caller, who closes it.
func (s *GormEventStore) Close() error { return nil }
