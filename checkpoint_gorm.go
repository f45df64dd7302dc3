package subscriptions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dialect"
	"github.com/eventfeed/subscriptions/internal/sqliteconf"
	"github.com/eventfeed/subscriptions/internal/sqlitequeue"
)

// GormCheckpointModel is the GORM model for subscriber checkpoints. The
// table is owned by this module and created by its migrations (package
// migrations), which NewGormCheckpointStore applies.
type GormCheckpointModel struct {
	Subscriber string    `gorm:"primaryKey;column:subscriber"`
	Position   int64     `gorm:"column:position;not null"`
	UpdatedAt  time.Time `gorm:"column:updated_at"`
	// RedeliveredThrough is the row's redelivery mark (DeliveryMarker):
	// the highest checkpoint it had before a reset moved it back.
	RedeliveredThrough int64 `gorm:"column:redelivered_through;not null;default:0"`
}

// TableName returns the table name for the checkpoint model.
func (GormCheckpointModel) TableName() string { return "subscriber_checkpoints" }

// GormCheckpointStore is a database-backed CheckpointStore. Each batch runs
// inside one database transaction: handlers that write to the same database
// through the batch transaction (TxFromContext) commit atomically with the
// checkpoint advance — exactly-once processing for same-database handlers.
//
// On Postgres the checkpoint row is locked with FOR UPDATE SKIP LOCKED, so
// N processes running the same subscriber coordinate as active/passive
// replicas: one wins each cycle, the others skip. SQLite relies on its
// serialized writers (single process): a batch takes the write lock when it
// is acquired, and within one store at most one batch per subscriber is
// active. The process's batches and appends on one database file take
// turns in arrival order (see GormEventStore), so that none waits out the
// busy timeout while the others proceed.
//
// Every Commit is a compare-and-set on the position the batch started
// from, so a checkpoint moved underneath a batch (by a Reset) makes the
// Commit fail with ErrCheckpointMoved instead of overwriting the reset.
//
// GormCheckpointStore is safe for concurrent use. It does not own the
// *gorm.DB.
type GormCheckpointStore struct {
	db      *gorm.DB
	pool    *sql.DB
	dialect *dialect.Dialect
	// schema is WithSchema's, "" when the pool's search_path selects the
	// tables; sql is the store's statements with its tables named.
	schema string
	sql    *checkpointSQL
	// resolved is the tables of the schema the pool's search_path
	// selects, once a probe resolved them (probeTables).
	resolved resolvedTables

	// Without row locks (SQLite) only, nil otherwise: the batches in
	// flight on this pool, shared by every store built on it, so that Reset
	// can abort them and Acquire can skip instead of queueing on the write
	// lock (forever, on a one-connection in-memory database).
	reg *batchRegistry
	// queue (SQLite) is the process's turns on the database file, which
	// the file's appends take too (internal/sqlitequeue): a batch takes
	// one for its life, waiting at most busy for the queue to move, so
	// that neither a stream of appends nor other batches keep it from
	// SQLite's write lock for a busy timeout.
	queue *sqlitequeue.Queue
	busy  time.Duration
}

// batchRegistry records the SQLite batches in flight on one pool.
type batchRegistry struct {
	mu     sync.Mutex
	active map[string]*gormBatch
	// resets holds the fences of the resets and deletes in progress; no
	// batch of the subscriber starts while one stands.
	resets nameFences
}

// sqliteRegistries maps each SQLite *sql.DB to its batchRegistry. The key
// is a weak pointer, and an entry is deleted when its pool is garbage
// collected, so that an application opening and closing many databases
// (one per tenant or job) does not keep every closed pool alive.
var sqliteRegistries = struct {
	mu sync.Mutex
	m  map[weak.Pointer[sql.DB]]*batchRegistry
}{m: make(map[weak.Pointer[sql.DB]]*batchRegistry)}

func registryFor(pool *sql.DB) *batchRegistry {
	key := weak.Make(pool)
	sqliteRegistries.mu.Lock()
	defer sqliteRegistries.mu.Unlock()
	if reg := sqliteRegistries.m[key]; reg != nil {
		return reg
	}
	reg := &batchRegistry{active: make(map[string]*gormBatch), resets: make(nameFences)}
	sqliteRegistries.m[key] = reg
	runtime.AddCleanup(pool, func(key weak.Pointer[sql.DB]) {
		sqliteRegistries.mu.Lock()
		delete(sqliteRegistries.m, key)
		sqliteRegistries.mu.Unlock()
	}, key)
	return reg
}

// sqliteRegistryCount is the number of pools with a batch registry (tests).
func sqliteRegistryCount() int {
	sqliteRegistries.mu.Lock()
	defer sqliteRegistries.mu.Unlock()
	return len(sqliteRegistries.m)
}

var (
	_ CheckpointStore    = (*GormCheckpointStore)(nil)
	_ CheckpointResetter = (*GormCheckpointStore)(nil)
)

// NewGormCheckpointStore creates a checkpoint store, applying the module's
// schema migrations if the database lacks any (migrations.Migrate: safe
// while other processes use the tables; no lock once the schema is up to
// date). With WithSchemaVerifyOnly it runs no DDL and only checks the
// schema; with WithSchema it uses, and migrates, the tables of that
// Postgres schema. Like the event feed itself, it supports Postgres and
// SQLite: replica coordination relies on row locking (Postgres) or
// serialized writers (SQLite), and other engines would silently
// double-process events.
//
// A batch holds one connection of db's pool for its life and never waits
// for a second (its attempt record is written on it): a pool of any size
// works, and one with a connection for every batch, append and call the
// process runs at once never makes one wait (the package documentation,
// Connections, gives the budget). migrations.VerifyOnly(db) makes it, and
// the other constructors given that handle, run no DDL.
func NewGormCheckpointStore(db *gorm.DB, opts ...GormStoreOption) (*GormCheckpointStore, error) {
	pool, d, sqlite, err := gormHandle("NewGormCheckpointStore", db)
	if err != nil {
		return nil, err
	}
	schemaName, err := ensureSchema("NewGormCheckpointStore", db, opts)
	if err != nil {
		return nil, err
	}
	g := &GormCheckpointStore{db: db, pool: pool, dialect: d, schema: schemaName, sql: newCheckpointSQL(tablesIn(schemaName), d)}
	if !d.RowLocks {
		g.reg = registryFor(pool)
	}
	if d == dialect.SQLite {
		g.queue, g.busy = sqlitequeue.For(sqlite.File), sqlite.BusyTimeout
	}
	return g, nil
}

// gormHandle checks a *gorm.DB handed to a constructor and returns its
// pool and dialect, and on SQLite what sqliteconf.Check read of it.
func gormHandle(constructor string, db *gorm.DB) (*sql.DB, *dialect.Dialect, sqliteconf.Settings, error) {
	var sqlite sqliteconf.Settings
	if db == nil {
		return nil, nil, sqlite, fmt.Errorf("subscriptions: %s: nil *gorm.DB", constructor)
	}
	d := dialect.Of(db)
	if d == nil {
		return nil, nil, sqlite, fmt.Errorf("subscriptions: %s: dialect %q is not supported (use postgres or sqlite)", constructor, db.Name())
	}
	pool, err := db.DB()
	if err != nil {
		return nil, nil, sqlite, fmt.Errorf("subscriptions: %s: %w", constructor, err)
	}
	if d == dialect.SQLite {
		if sqlite, err = sqliteconf.Check(context.Background(), db, pool, "subscriptions: "+constructor); err != nil {
			return nil, nil, sqlite, err
		}
	}
	return pool, d, sqlite, nil
}

// Acquire begins a batch transaction holding the subscriber's checkpoint
// row. On Postgres, acquired is false when another process holds the row;
// on SQLite, when another batch of this store holds it.
//
// The batch's transaction lives until Commit or Rollback; the caller owns
// it and must end it.
func (g *GormCheckpointStore) Acquire(ctx context.Context, subscriber string) (Batch, bool, error) {
	if err := validateName(subscriber); err != nil {
		return nil, false, fmt.Errorf("subscriptions: acquire: %w", err)
	}
	b := &gormBatch{store: g, subscriber: subscriber, done: make(chan struct{})}
	if g.reg != nil {
		g.reg.mu.Lock()
		if g.reg.active[subscriber] != nil || g.reg.resets[subscriber] != nil {
			g.reg.mu.Unlock()
			return nil, false, nil
		}
		g.reg.active[subscriber] = b
		g.reg.mu.Unlock()
	}
	if g.queue != nil {
		turn, err := g.queue.Wait(ctx, g.busy)
		if err != nil {
			b.release()
			return nil, false, fmt.Errorf("subscriptions: acquire checkpoint of %q: %w", subscriber, err)
		}
		b.turn = turn // ended by release, with the batch
	}
	acquired, err := g.begin(ctx, b)
	if err != nil || !acquired {
		b.release()
		return nil, false, err
	}
	return b, true, nil
}

func (g *GormCheckpointStore) begin(ctx context.Context, b *gormBatch) (bool, error) {
	if !g.dialect.RowLocks {
		return g.beginSQLite(ctx, b)
	}
	acquired, exists, err := g.lockPostgres(ctx, b)
	if err != nil || acquired || exists {
		return acquired, err
	}
	// No row yet. Create it in a statement of its own, committed at once:
	// created inside a batch, the uncommitted row would make every other
	// replica's first Acquire wait for that whole batch instead of skipping.
	if err := g.db.WithContext(ctx).Exec(g.sql.createRow, b.subscriber, time.Now().UTC()).Error; err != nil {
		return false, fmt.Errorf("subscriptions: acquire checkpoint of %q: create row: %w", b.subscriber, err)
	}
	acquired, _, err = g.lockPostgres(ctx, b)
	return acquired, err
}

// lockPostgres begins the batch transaction and locks the subscriber's row
// (lockRow), skipping it when another transaction holds it or the name is
// paused. exists reports whether the row exists at all, when it could not
// be locked.
//
// The transaction is pinned to a connection for the batch's life, which
// the batch's attempt records are written on too (renew): a batch never
// needs a second connection.
func (g *GormCheckpointStore) lockPostgres(ctx context.Context, b *gormBatch) (acquired, exists bool, err error) {
	conn, err := g.pool.Conn(ctx)
	if err != nil {
		return false, false, fmt.Errorf("subscriptions: acquire checkpoint of %q: connection: %w", b.subscriber, err)
	}
	stx, err := conn.BeginTx(ctx, g.txOptions())
	if err != nil {
		_ = conn.Close()
		return false, false, fmt.Errorf("subscriptions: acquire checkpoint of %q: begin: %w", b.subscriber, err)
	}
	tx := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
	tx.Statement.ConnPool = stx
	end := func() {
		_ = stx.Rollback()
		_ = conn.Close()
	}
	var row lockedRow
	if err := tx.Raw(g.sql.lockRow, lockRowArgs(b.subscriber)...).Scan(&row).Error; err != nil {
		end()
		return false, false, fmt.Errorf("subscriptions: acquire checkpoint of %q: lock row: %w", b.subscriber, err)
	}
	if row.Position != nil && !row.Paused {
		b.tx, b.conn = tx, conn
		b.position, b.marks = *row.Position, row.marks()
		return true, true, nil
	}
	end()
	return false, row.Present, nil // held elsewhere, paused, or missing
}

// beginSQLite begins the batch transaction on a connection pinned from the
// pool for the batch's life, so that the batch decides what happens to
// the connection when its transaction ends badly (see gormBatch.closeConn).
func (g *GormCheckpointStore) beginSQLite(ctx context.Context, b *gormBatch) (bool, error) {
	conn, err := g.pool.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("subscriptions: acquire checkpoint of %q: connection: %w", b.subscriber, err)
	}
	stx, err := conn.BeginTx(ctx, g.txOptions())
	if err != nil {
		_ = conn.Close()
		return false, fmt.Errorf("subscriptions: acquire checkpoint of %q: begin: %w", b.subscriber, err)
	}
	tx := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
	tx.Statement.ConnPool = stx
	// Publish the transaction for a Reset that may abort the batch from
	// now on; one that already did so wins: the batch is given up.
	b.abortMu.Lock()
	aborted := b.aborted
	if !aborted {
		b.tx, b.conn = tx, conn
	}
	b.abortMu.Unlock()
	if aborted {
		if err := stx.Rollback(); err != nil {
			cleanSQLiteConn(conn)
		}
		_ = conn.Close()
		return false, nil
	}
	fail := func(what string, err error) (bool, error) {
		if b.abortedByReset() {
			b.closeConn(false) // the Reset rolled the transaction back
			return false, nil
		}
		b.closeConn(stx.Rollback() != nil)
		return false, fmt.Errorf("subscriptions: acquire checkpoint of %q: %s: %w", b.subscriber, what, err)
	}
	// The insert comes first so that the batch takes SQLite's write lock at
	// once, whatever the DSN's transaction mode.
	if err := tx.Exec(g.sql.createRow, b.subscriber, time.Now().UTC()).Error; err != nil {
		return fail("create row", err)
	}
	var row lockedRow
	if err := tx.Raw(g.sql.readLockedRow, lockRowArgs(b.subscriber)...).Scan(&row).Error; err != nil {
		return fail("read row", err)
	}
	if row.Position == nil {
		return fail("read row", errors.New("row vanished"))
	}
	if row.Paused {
		b.closeConn(stx.Rollback() != nil)
		return false, nil // as if held
	}
	b.position, b.marks = *row.Position, row.marks()
	return true, nil
}

// txOptions pins batches with row locks (Postgres) to READ COMMITTED
// whatever the server's default_transaction_isolation: row locking with
// SKIP LOCKED and the compare-and-set commit are designed for it, and a
// stricter level would turn ordinary replica contention into
// serialization failures (see dialect.TxOptions).
func (g *GormCheckpointStore) txOptions() *sql.TxOptions { return g.dialect.TxOptions() }

// Position returns the subscriber's committed checkpoint (0 if unknown).
// It is one indexed read, without a transaction or lock.
func (g *GormCheckpointStore) Position(ctx context.Context, subscriber string) (int64, error) {
	var positions []int64
	if err := g.db.WithContext(ctx).Raw(g.sql.position, subscriber).Scan(&positions).Error; err != nil {
		return 0, fmt.Errorf("subscriptions: read checkpoint of %q: %w", subscriber, err)
	}
	if len(positions) == 0 {
		return 0, nil
	}
	return positions[0], nil
}

// Reset sets the subscriber's checkpoint, creating the row if needed. On
// Postgres it blocks until any in-flight batch for the subscriber finishes
// (the batch transaction holds the row). On SQLite a concurrent in-flight
// batch is not blocked; instead its Commit detects that the checkpoint
// moved and aborts, so the reset always wins and processing resumes from
// the reset position. Reset returns once the reset is committed. It is
// ResetWith without the application's statements.
//
// On SQLite the Reset does not wait for the batch either: it rolls the
// batch's transaction back itself (the batch holds the database's write
// lock, which the reset needs), so it also returns when called from the
// goroutine that owns the batch. The batch's handler writes are discarded,
// its remaining statements fail, and the subscriber treats that as the
// reset, not as a handler failure.
func (g *GormCheckpointStore) Reset(ctx context.Context, subscriber string, position int64) error {
	return g.ResetWith(ctx, subscriber, position, nil)
}

// fenceSQLite keeps new batches of subscriber out of every store on this
// pool and aborts the batch in flight, if any (abortForReset): its
// transaction is rolled back at once, so SQLite's write lock is free for
// the reset, and its Commit fails with ErrCheckpointMoved. The reset never
// waits for the batch's owner, who may be the reset's own goroutine. The
// fence stands until release is called, so that a busy subscriber cannot
// slip a batch in before the reset is written. what names the operation (a
// reset or a delete) in errors.
func (g *GormCheckpointStore) fenceSQLite(ctx context.Context, subscriber, what string) (release func(), err error) {
	// Another reset or delete of the subscriber goes first.
	if err := g.reg.resets.raise(ctx, &g.reg.mu, subscriber); err != nil {
		return nil, fmt.Errorf("subscriptions: %s: waiting for another reset or delete: %w", what, err)
	}
	inFlight := g.reg.active[subscriber]
	g.reg.mu.Unlock()
	if inFlight != nil {
		inFlight.abortForReset()
	}
	return func() {
		g.reg.mu.Lock()
		g.reg.resets.lower(subscriber)
		g.reg.mu.Unlock()
	}, nil
}

type txContextKey struct{}

// batchTx is what a database-backed batch attaches to handler contexts:
// the transaction, and the pool it was begun on so that a ParkingLot can
// tell whether the transaction belongs to its own database.
type batchTx struct {
	tx   *gorm.DB
	pool *sql.DB
	// conn is the pooled connection a batch's transaction is pinned to
	// (CopyFrom reaches the driver's connection through it); nil for a
	// transaction of another kind.
	conn *sql.Conn
}

// TxFromContext returns the batch transaction attached to a handler's
// context by a GormCheckpointStore batch, or nil when the handler is not
// running inside a database-backed batch. Handlers that write projections
// to the same database should write through this transaction: those writes
// then commit atomically with the checkpoint advance (exactly-once),
// instead of relying on at-least-once redelivery.
//
// The transaction is owned by the batch, which commits it together with
// the checkpoint. A handler must not:
//   - end it: Commit and Rollback return an error wrapping sql.ErrTxDone,
//     end nothing, and fail the attempt even if the handler ignores the
//     error (its writes are discarded and the event takes the failure
//     path, see the package documentation). To discard its writes, a
//     handler returns an error. Transaction(fn) on it is fine: it nests
//     through a savepoint;
//   - leave it failed: on Postgres a statement that fails aborts the whole
//     transaction, so return the error rather than carry on;
//   - keep it open long (idle_in_transaction_session_timeout ends the
//     session) or use it from another goroutine or after returning.
//
// Each call returns a new session on the same transaction. Handlers
// written against database/sql or sqlc get the same transaction from
// SQLTxFromContext.
func TxFromContext(ctx context.Context) *gorm.DB {
	if ctx == nil {
		return nil
	}
	if v, ok := ctx.Value(txContextKey{}).(*batchTx); ok {
		// A session of its own per call: an error gorm records on the
		// returned handle (a refused Commit) stays with this caller.
		return v.tx.Session(&gorm.Session{NewDB: true})
	}
	return nil
}

func withTx(ctx context.Context, tx *gorm.DB, pool *sql.DB) context.Context {
	return context.WithValue(ctx, txContextKey{}, &batchTx{tx: tx, pool: pool})
}

// withBatchTx is withTx for a batch's transaction, pinned to conn.
func withBatchTx(ctx context.Context, tx *gorm.DB, pool *sql.DB, conn *sql.Conn) context.Context {
	return context.WithValue(ctx, txContextKey{}, &batchTx{tx: tx, pool: pool, conn: conn})
}

// txForPool returns the context's batch transaction only when it was begun
// on pool.
func txForPool(ctx context.Context, pool *sql.DB) *gorm.DB {
	if v, ok := ctx.Value(txContextKey{}).(*batchTx); ok && v.pool == pool && pool != nil {
		return v.tx
	}
	return nil
}
