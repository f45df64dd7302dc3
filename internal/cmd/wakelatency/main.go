// Command wakelatency measures how quickly a subscriber woken by
// PostgresListener handles a new event on Postgres: from the start of
// Append to the start of the handler, over single-event appends made one at
// a time from a second pool (another process, as far as the server can
// tell). It prints p50/p90/p99/max for
//
//   - idle: nothing else happening;
//   - busy: while another connection keeps an unrelated write transaction
//     open (an insert into another table, held 2 s, over and over);
//   - baseline: a bare LISTEN connection's NOTIFY latency, from the start of
//     a pg_notify on another connection to WaitForNotification returning.
//
// With -compare (the default) it also prices one round trip through pgx
// and through GORM, and repeats the idle scenario with two raw pgx
// appenders (the same six statements without GORM; the same append
// pipelined into one round trip) to show where the append's time goes.
//
// Each scenario's total is split into append (Append start to return, i.e.
// commit), notify (Append return to the listener's fan-out) and cycle
// (fan-out to handler start: the subscriber's Position, ReadAfter and
// Acquire round trips).
//
// It works in a fresh schema that it creates and drops:
//
//	go run ./internal/cmd/wakelatency -dsn postgres://postgres@127.0.0.1:5432/test?sslmode=disable
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/sqlschema"
)

func main() {
	dsn := flag.String("dsn", dbtest.DefaultPostgresDSN, "Postgres DSN (a fresh schema is created in its database and dropped)")
	n := flag.Int("n", 1000, "single-event appends per scenario")
	gap := flag.Duration("gap", 3*time.Millisecond, "pause between one event being handled and the next append")
	flag.Parse()
	if err := run(*dsn, *n, *gap); err != nil {
		log.Fatal(err)
	}
}

func run(baseDSN string, n int, gap time.Duration) error {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, baseDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(ctx)
	schema := "wakelatency_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			log.Printf("drop schema %s: %v", schema, err)
		}
	}()
	dsn, err := dbtest.WithSearchPath(baseDSN, schema)
	if err != nil {
		return err
	}

	var version string
	_ = admin.QueryRow(ctx, "SHOW server_version").Scan(&version)
	fmt.Printf("server %s, %d appends per scenario, %v apart, schema %s\n\n", version, n, gap, schema)

	if err := baseline(ctx, dsn, n, gap); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	b, err := newBench(ctx, dsn)
	if err != nil {
		return err
	}
	defer b.close()
	if err := roundTrips(ctx, dsn, b.dbs[1], n); err != nil {
		return fmt.Errorf("round trips: %w", err)
	}
	if err := b.measure(ctx, "idle: GormEventStore.Append", n, gap, b.gormAppend); err != nil {
		return err
	}
	stopBusy, err := holdWriteTransactions(ctx, dsn)
	if err != nil {
		return err
	}
	err = b.measure(ctx, "busy (unrelated write tx held open 2 s, repeatedly): GormEventStore.Append", n, gap, b.gormAppend)
	if berr := stopBusy(); err == nil {
		err = berr
	}
	if err != nil || !*compare {
		return err
	}

	// Where the append's time goes: the same statements without GORM and
	// database/sql, then the same append pipelined into one round trip.
	raw, err := newRawAppender(ctx, dsn)
	if err != nil {
		return err
	}
	defer raw.conn.Close(context.Background())
	if err := b.measure(ctx, "idle: raw pgx, the same 6 round trips as GormEventStore.Append", n, gap, raw.sameStatements); err != nil {
		return err
	}
	if err := b.measure(ctx, "idle: raw pgx, lock+insert+notify pipelined in 1 round trip", n, gap, raw.pipelined); err != nil {
		return err
	}
	// The append's floor is its commit's WAL flush: price it, then take it
	// away (for this one session only) to show what is left.
	if err := commitFloor(ctx, dsn, n); err != nil {
		return fmt.Errorf("commit floor: %w", err)
	}
	if _, err := raw.conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return err
	}
	return b.measure(ctx, "idle: raw pgx pipelined, synchronous_commit=off for the appending session", n, gap, raw.pipelined)
}

// commitFloor measures a one-row autocommit insert into an unrelated table,
// with and without waiting for the WAL flush.
func commitFloor(ctx context.Context, dsn string, n int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS commit_floor (id bigserial PRIMARY KEY)"); err != nil {
		return err
	}
	phases := map[string][]time.Duration{}
	for _, mode := range []string{"on", "off"} {
		if _, err := conn.Exec(ctx, "SET synchronous_commit = "+mode); err != nil {
			return err
		}
		for range n {
			began := time.Now()
			if _, err := conn.Exec(ctx, "INSERT INTO commit_floor DEFAULT VALUES"); err != nil {
				return err
			}
			phases["sync_"+mode] = append(phases["sync_"+mode], time.Since(began))
		}
	}
	report("one-row autocommit INSERT (synchronous_commit on / off)", phases)
	return nil
}

var compare = flag.Bool("compare", true, "also measure raw pgx appends (same statements; pipelined) to locate the append's cost")

// roundTrips measures one trivial statement's round trip, through pgx and
// through GORM (database/sql), to price the round trips on both paths.
func roundTrips(ctx context.Context, dsn string, db *gorm.DB, n int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var viaPgx, viaGorm []time.Duration
	for range n {
		began := time.Now()
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			return err
		}
		viaPgx = append(viaPgx, time.Since(began))
		began = time.Now()
		if err := db.WithContext(ctx).Raw("SELECT 1").Scan(&one).Error; err != nil {
			return err
		}
		viaGorm = append(viaGorm, time.Since(began))
	}
	report("one round trip (SELECT 1)", map[string][]time.Duration{"pgx": viaPgx, "gorm": viaGorm})
	return nil
}

// rawAppender appends with pgx directly, taking the GormEventStore's
// append lock so that the feed stays sound.
type rawAppender struct {
	conn *pgx.Conn
	key  int64
}

func newRawAppender(ctx context.Context, dsn string) (*rawAppender, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	var qualified string
	if err := conn.QueryRow(ctx, `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('events')`).Scan(&qualified); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return &rawAppender{conn: conn, key: sqlschema.Key("append", qualified)}, nil
}

func (r *rawAppender) sameStatements(ctx context.Context, ev domain.EventEnvelope[any]) error {
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, r.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", r.key); err != nil {
			return err
		}
		var version int
		var position int64
		if err := tx.QueryRow(ctx, `SELECT
			(SELECT COALESCE(MAX(sequence_no), 0) FROM events WHERE aggregate_id = $1),
			(SELECT COALESCE(MAX(position), 0) FROM events)`, ev.AggregateID).Scan(&version, &position); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
			VALUES ($1, $2, $3, $4, '', $5, $6::jsonb, '{}'::jsonb, $7)`,
			ev.ID, ev.AggregateID, ev.EventType, version+1, position+1, string(payload), ev.Created); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", infrastructure.PostgresNotifyChannel)
		return err
	})
}

func (r *rawAppender) pipelined(ctx context.Context, ev domain.EventEnvelope[any]) error {
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return err
	}
	// One implicit transaction (the batch ends in a single Sync); under
	// READ COMMITTED the INSERT's snapshot is taken after the lock.
	batch := &pgx.Batch{}
	batch.Queue("SELECT pg_advisory_xact_lock($1)", r.key)
	batch.Queue(`INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
		SELECT $1, $2, $3,
			(SELECT COALESCE(MAX(sequence_no), 0) FROM events WHERE aggregate_id = $2) + 1, '',
			(SELECT COALESCE(MAX(position), 0) FROM events) + 1, $4::jsonb, '{}'::jsonb, $5`,
		ev.ID, ev.AggregateID, ev.EventType, string(payload), ev.Created)
	batch.Queue("SELECT pg_notify($1, '')", infrastructure.PostgresNotifyChannel)
	return r.conn.SendBatch(ctx, batch).Close()
}

// baseline measures a bare LISTEN connection: pg_notify on one connection
// (autocommit) to WaitForNotification returning on the other.
func baseline(ctx context.Context, dsn string, n int, gap time.Duration) error {
	listenConn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer listenConn.Close(ctx)
	notifyConn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer notifyConn.Close(ctx)
	const channel = "wakelatency_baseline"
	if _, err := listenConn.Exec(ctx, "LISTEN "+channel); err != nil {
		return err
	}
	var lat []time.Duration
	for range n {
		began := time.Now()
		if _, err := notifyConn.Exec(ctx, "SELECT pg_notify('"+channel+"', '')"); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := listenConn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(began))
		time.Sleep(gap)
	}
	report("baseline: bare LISTEN, pg_notify start to WaitForNotification return", map[string][]time.Duration{"total": lat})
	return nil
}

// bench is one subscriber process (its own pool and PostgresListener) and
// one appending process (another pool).
type bench struct {
	appendTo *infrastructure.GormEventStore
	handled  chan handledEvent
	fanned   atomic.Int64 // unix nanos of the listener's latest fan-out
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	dbs      []*gorm.DB
}

type handledEvent struct {
	id string
	at time.Time
}

func openDB(dsn string) (*gorm.DB, error) {
	return gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
}

func newBench(ctx context.Context, dsn string) (*bench, error) {
	subDB, err := openDB(dsn)
	if err != nil {
		return nil, err
	}
	appDB, err := openDB(dsn)
	if err != nil {
		return nil, err
	}
	b := &bench{handled: make(chan handledEvent, 16), dbs: []*gorm.DB{subDB, appDB}}
	events, err := infrastructure.NewGormEventStore(subDB)
	if err != nil {
		return nil, err
	}
	if b.appendTo, err = infrastructure.NewGormEventStore(appDB); err != nil {
		return nil, err
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(subDB)
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	warn := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	listener, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(warn))
	if err != nil {
		return nil, err
	}
	sub, err := subscriptions.NewSubscriber("wakelatency", events, checkpoints,
		func(_ context.Context, ev domain.EventEnvelope[any]) error {
			b.handled <- handledEvent{id: ev.ID, at: time.Now()}
			return nil
		},
		subscriptions.WithPollInterval(time.Minute), subscriptions.WithWakeSignal(listener.Subscribe()),
		subscriptions.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	probe := listener.Subscribe()

	rctx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	b.wg.Go(func() { _ = listener.Run(rctx) })
	b.wg.Go(func() { _ = sub.Run(rctx) })
	b.wg.Go(func() {
		for {
			select {
			case <-rctx.Done():
				return
			case <-probe:
				b.fanned.Store(time.Now().UnixNano())
			}
		}
	})
	// Warm up: the first event is handled once the listener is up.
	ev := domain.NewEventEnvelope[any](map[string]any{"warmup": true}, "warmup", "wakelatency.warmup", 0)
	if err := b.appendTo.Append(ctx, ev.AggregateID, -1, ev); err != nil {
		return nil, err
	}
	if _, err := b.wait(ev.ID, 30*time.Second); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *bench) wait(id string, timeout time.Duration) (time.Time, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case h := <-b.handled:
			if h.id == id {
				return h.at, nil
			}
		case <-timer.C:
			return time.Time{}, fmt.Errorf("event %s not handled within %v", id, timeout)
		}
	}
}

// appender appends one event; the GormEventStore's Append, or one of the
// raw pgx variants used to find where the append's time goes.
type appender func(ctx context.Context, ev domain.EventEnvelope[any]) error

func (b *bench) gormAppend(ctx context.Context, ev domain.EventEnvelope[any]) error {
	return b.appendTo.Append(ctx, ev.AggregateID, -1, ev)
}

func (b *bench) measure(ctx context.Context, name string, n int, gap time.Duration, appendOne appender) error {
	phases := map[string][]time.Duration{}
	for i := range n {
		ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, fmt.Sprintf("agg-%d", i%16), "wakelatency.event", 0)
		began := time.Now()
		if err := appendOne(ctx, ev); err != nil {
			return err
		}
		committed := time.Now()
		at, err := b.wait(ev.ID, 10*time.Second)
		if err != nil {
			return err
		}
		phases["total"] = append(phases["total"], at.Sub(began))
		phases["append"] = append(phases["append"], committed.Sub(began))
		if fanned := time.Unix(0, b.fanned.Load()); fanned.After(began) && fanned.Before(at) {
			phases["notify"] = append(phases["notify"], fanned.Sub(committed))
			phases["cycle"] = append(phases["cycle"], at.Sub(fanned))
		}
		time.Sleep(gap)
	}
	report(name, phases)
	return nil
}

func (b *bench) close() {
	b.cancel()
	b.wg.Wait()
	for _, db := range b.dbs {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	}
}

// holdWriteTransactions keeps an unrelated write transaction open on its
// own connection: insert into another table, hold 2 s, commit, repeat.
func holdWriteTransactions(ctx context.Context, dsn string) (stop func() error, err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE unrelated (id bigserial PRIMARY KEY, note text)"); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		defer conn.Close(context.Background())
		for {
			tx, err := conn.Begin(hctx)
			if err != nil {
				done <- ignoreCancel(hctx, err)
				return
			}
			if _, err := tx.Exec(hctx, "INSERT INTO unrelated (note) VALUES ('held open')"); err != nil {
				_ = tx.Rollback(context.Background())
				done <- ignoreCancel(hctx, err)
				return
			}
			timer := time.NewTimer(2 * time.Second)
			select {
			case <-hctx.Done():
				timer.Stop()
				_ = tx.Rollback(context.Background())
				done <- nil
				return
			case <-timer.C:
			}
			if err := tx.Commit(hctx); err != nil {
				done <- ignoreCancel(hctx, err)
				return
			}
		}
	}()
	return func() error { cancel(); return <-done }, nil
}

func ignoreCancel(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func report(name string, phases map[string][]time.Duration) {
	fmt.Println(name)
	for _, phase := range []string{"total", "append", "notify", "cycle", "pgx", "gorm", "sync_on", "sync_off"} {
		ds := phases[phase]
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
		fmt.Printf("  %-7s n=%-5d p50=%-9v p90=%-9v p99=%-9v max=%v\n", phase, len(ds),
			q(0.50).Round(time.Microsecond), q(0.90).Round(time.Microsecond), q(0.99).Round(time.Microsecond), ds[len(ds)-1].Round(time.Microsecond))
	}
	fmt.Println()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
