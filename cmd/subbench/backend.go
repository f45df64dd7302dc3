package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// backend is one Postgres backend of the library, as the scenarios that
// measure both (catch-up, wake latency, idle cost, appends) see it: how to
// open its stores on a pool of its own, and how statements run on that
// pool, in a plain transaction, and in a handler's batch transaction.
type backend struct {
	name string // "GORM", "pgx"
	// open opens a pool of at most maxConns connections on dsn, its
	// sessions named runID_app when app is set, tracer (when set) seeing
	// every statement, and the backend's stores on it. The pool is closed
	// with the scenario (or the case: casePools).
	open func(ctx context.Context, b *bench, dsn, app string, maxConns int, tracer pgx.QueryTracer) (*backendDB, error)
}

// checkpointStore is what the scenarios use of a backend's checkpoint
// store.
type checkpointStore interface {
	subscriptions.CheckpointStore
	Reset(ctx context.Context, subscriber string, position int64) error
	Position(ctx context.Context, subscriber string) (int64, error)
}

// execFunc runs one statement, its placeholders written '?', in the
// transaction it was made for.
type execFunc func(sql string, args ...any) error

// backendDB is one pool of a backend and its stores.
type backendDB struct {
	backend *backend
	engine  string // "postgres", "sqlite"
	store   domain.EventStore
	cps     checkpointStore
	lot     subscriptions.ParkingLot
	// channel is the one the store NOTIFYs on after each append.
	channel string
	// exec runs one statement ('?' placeholders) on the pool.
	exec func(ctx context.Context, sql string, args ...any) error
	// scan runs a query of one row and scans it into dest.
	scan func(ctx context.Context, sql string, dest ...any) error
	// inTx runs fn in a plain transaction of its own on the pool, without
	// the library: the baselines.
	inTx func(ctx context.Context, fn func(exec execFunc) error) error
	// batchExec is the handler's batch transaction that ctx carries, as
	// the backend hands it to handlers (TxFromContext); nil outside one.
	batchExec func(ctx context.Context) execFunc
}

var (
	gormBackend = &backend{name: "GORM"}
	pgxBackend  = &backend{name: "pgx"}
	// pgBackends are the backends the comparing scenarios run, GORM first.
	pgBackends = []*backend{gormBackend, pgxBackend}
)

// init sets the backends' open functions, which name the backends in
// turn (an initialization cycle in their declarations).
func init() {
	gormBackend.open = openGormBackend
	pgxBackend.open = openPgxBackend
}

// label is the case label of a row of this backend: GORM's rows keep the
// labels they had before there was a second backend.
func (be *backend) label(s string) string {
	if be == gormBackend {
		return s
	}
	return be.name + ": " + s
}

func openGormBackend(ctx context.Context, b *bench, dsn, app string, maxConns int, tracer pgx.QueryTracer) (*backendDB, error) {
	db, err := b.openPGAs(dsn, app, maxConns, tracer)
	if err != nil {
		return nil, err
	}
	return gormBackendDB(db)
}

// gormBackendDB is the GORM backend on db (Postgres or SQLite): a
// GormEventStore, GormCheckpointStore and GormParkingLot.
func gormBackendDB(db *gorm.DB) (*backendDB, error) {
	store, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return nil, fmt.Errorf("GORM event store: %w", err)
	}
	cps, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, fmt.Errorf("GORM checkpoint store: %w", err)
	}
	lot, err := subscriptions.NewGormParkingLot(db)
	if err != nil {
		return nil, fmt.Errorf("GORM parking lot: %w", err)
	}
	gormExec := func(tx *gorm.DB) execFunc {
		return func(sql string, args ...any) error { return tx.Exec(sql, args...).Error }
	}
	return &backendDB{
		backend: gormBackend,
		engine:  db.Name(),
		store:   store, cps: cps, lot: lot,
		channel: infrastructure.PostgresNotifyChannel,
		exec: func(ctx context.Context, sql string, args ...any) error {
			return db.WithContext(ctx).Exec(sql, args...).Error
		},
		scan: func(ctx context.Context, sql string, dest ...any) error {
			return db.WithContext(ctx).Raw(sql).Row().Scan(dest...)
		},
		inTx: func(ctx context.Context, fn func(exec execFunc) error) error {
			return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return fn(gormExec(tx)) })
		},
		batchExec: func(ctx context.Context) execFunc {
			if tx := subscriptions.TxFromContext(ctx); tx != nil {
				return gormExec(tx)
			}
			return nil
		},
	}, nil
}

func openPgxBackend(ctx context.Context, b *bench, dsn, app string, maxConns int, tracer pgx.QueryTracer) (*backendDB, error) {
	pool, err := b.openPgxPool(ctx, dsn, app, maxConns, tracer)
	if err != nil {
		return nil, err
	}
	store, err := pgxstore.NewEventStore(ctx, pool, pgxstore.WithNotifyChannel(pgxstore.DefaultNotifyChannel))
	if err != nil {
		return nil, fmt.Errorf("pgx event store: %w", err)
	}
	cps, err := pgxstore.NewCheckpointStore(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("pgx checkpoint store: %w", err)
	}
	lot, err := pgxstore.NewParkingLot(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("pgx parking lot: %w", err)
	}
	txExec := func(ctx context.Context, tx pgx.Tx) execFunc {
		return func(sql string, args ...any) error {
			_, err := tx.Exec(ctx, dollarPlaceholders(sql), args...)
			return err
		}
	}
	return &backendDB{
		backend: pgxBackend,
		engine:  "postgres",
		store:   store, cps: cps, lot: lot,
		channel: pgxstore.DefaultNotifyChannel,
		exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := pool.Exec(ctx, dollarPlaceholders(sql), args...)
			return err
		},
		scan: func(ctx context.Context, sql string, dest ...any) error {
			return pool.QueryRow(ctx, sql).Scan(dest...)
		},
		inTx: func(ctx context.Context, fn func(exec execFunc) error) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(txExec(ctx, tx)) })
		},
		batchExec: func(ctx context.Context) execFunc {
			if tx := pgxstore.TxFromContext(ctx); tx != nil {
				return txExec(ctx, tx)
			}
			return nil
		},
	}, nil
}

// openPgxPool opens a pgx pool of at most maxConns connections on dsn, as
// openPGAs opens a GORM one: sessions named runID_app when app is set,
// tracer (when set) seeing every statement, closed with the scenario.
func (b *bench) openPgxPool(ctx context.Context, dsn, app string, maxConns int, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	if app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = b.runID + "_" + app
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pgx pool: %w", err)
	}
	b.pools = append(b.pools, func() error { pool.Close(); return nil })
	return pool, nil
}

// dollarCache holds dollarPlaceholders' results: the scenarios run a few
// statements many times.
var dollarCache sync.Map

// dollarPlaceholders rewrites the '?' placeholders of sql (GORM's) as $1,
// $2, ... (pgx's). The scenarios' statements have no '?' elsewhere.
func dollarPlaceholders(sql string) string {
	if v, ok := dollarCache.Load(sql); ok {
		return v.(string)
	}
	var out strings.Builder
	n := 0
	for _, r := range sql {
		if r == '?' {
			n++
			out.WriteString("$" + strconv.Itoa(n))
			continue
		}
		out.WriteRune(r)
	}
	dollarCache.Store(sql, out.String())
	return out.String()
}
