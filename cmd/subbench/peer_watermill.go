package main

import (
	"cmp"
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// The peer's topics, one messages table each (watermill_<topic>).
const (
	wmBacklogTopic = "peer_backlog" // the catch-ups' backlog, appended anew for each
	wmAppendTopic  = "peer_appends" // the appends' (never consumed)
	wmWakeTopic    = "peer_wake"    // the wake latency's and the idle consumer's
)

// wmPeer is watermill-sql's side of scenario 12, on a schema of its own.
type wmPeer struct {
	b      *bench
	sz     peerSizes
	dsn    string
	setup  *stdsql.DB
	upsert string
	// errors counts the errors watermill-sql logged (it retries them)
	// but those of its consumers being stopped (stopping set).
	errors   atomic.Int64
	stopping atomic.Bool
	// conflicts counts the polls it repeated after a serialization
	// failure (consumers locking the same rows; it logs them at debug).
	conflicts atomic.Int64
}

func newWatermillPeer(ctx context.Context, b *bench, sz peerSizes) (*wmPeer, error) {
	dsn, err := b.newSchema(ctx, "peer_wm")
	if err != nil {
		return nil, err
	}
	p := &wmPeer{b: b, sz: sz, dsn: dsn, upsert: dollarPlaceholders(peerUpsert)}
	if p.setup, err = p.open(2, nil); err != nil {
		return nil, err
	}
	stmts := []string{peerProjection}
	for _, topic := range []string{wmBacklogTopic, wmAppendTopic, wmWakeTopic} {
		qs, err := wmsql.PostgreSQLQueueSchema{}.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: topic})
		if err != nil {
			return nil, err
		}
		for _, q := range qs {
			stmts = append(stmts, q.Query)
		}
	}
	for _, s := range stmts {
		if _, err := p.setup.ExecContext(ctx, s); err != nil {
			return nil, fmt.Errorf("set up: %w", err)
		}
	}
	return p, nil
}

// open opens a database/sql pool over pgx's driver (watermill-sql's
// BeginnerFromStdSQL takes one), tracer (when set) seeing its statements,
// closed with the scenario or the case.
func (p *wmPeer) open(maxConns int, tracer pgx.QueryTracer) (*stdsql.DB, error) {
	cfg, err := pgx.ParseConfig(p.dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	if tracer != nil {
		cfg.Tracer = tracer
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	p.b.pools = append(p.b.pools, db.Close)
	return db, nil
}

func (p *wmPeer) logger() watermill.LoggerAdapter {
	return wmLogger{errors: &p.errors, stopping: &p.stopping, conflicts: &p.conflicts, verbose: p.b.cfg.Verbose}
}

func (p *wmPeer) publisher(db *stdsql.DB) (*wmsql.Publisher, error) {
	return wmsql.NewPublisher(wmsql.BeginnerFromStdSQL(db), wmsql.PublisherConfig{SchemaAdapter: wmsql.PostgreSQLQueueSchema{}}, p.logger())
}

// subscriber is a watermill-sql subscriber of the queue schema on a pool
// of its own, polling every peerPoll.
func (p *wmPeer) subscriber(tracer pgx.QueryTracer) (*wmsql.Subscriber, error) {
	db, err := p.open(2, tracer)
	if err != nil {
		return nil, err
	}
	return wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db), wmsql.SubscriberConfig{
		SchemaAdapter:  wmsql.PostgreSQLQueueSchema{SubscribeBatchSize: peerBatch},
		OffsetsAdapter: wmsql.PostgreSQLQueueOffsetsAdapter{},
		PollInterval:   peerPoll,
	}, p.logger())
}

// message is the peer's message for one event: its ID as the UUID, the
// payload as the events table holds it, the aggregate and type as
// metadata.
func wmMessage(ctx context.Context, aggregate string, i int) (*message.Message, error) {
	ev := makeEvents(1, i)[0]
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(ev.ID, payload)
	msg.Metadata.Set("aggregate_id", aggregate)
	msg.Metadata.Set("event_type", ev.EventType)
	msg.SetContext(ctx)
	return msg, nil
}

// consume runs one goroutine per subscriber of subs on topic, calling
// handle with each message and acking it when handle returns nil; the
// first error handle returns (before stop) is kept. stop cancels the
// subscriptions, closes the subscribers and waits for the goroutines.
func (p *wmPeer) consume(ctx context.Context, subs []*wmsql.Subscriber, topic string, handle func(msg *message.Message) error) (failed func() error, stop func() error, err error) {
	rctx, cancel := context.WithCancel(ctx)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	p.stopping.Store(false)
	stop = func() error {
		p.stopping.Store(true)
		cancel()
		var errs []error
		for _, s := range subs {
			errs = append(errs, s.Close())
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	for _, s := range subs {
		ch, err := s.Subscribe(rctx, topic)
		if err != nil {
			return nil, nil, errors.Join(err, stop())
		}
		wg.Go(func() {
			for msg := range ch {
				if err := handle(msg); err != nil {
					msg.Nack()
					if !p.stopping.Load() {
						mu.Lock()
						first = cmp.Or(first, err)
						mu.Unlock()
					}
					continue
				}
				msg.Ack()
			}
		})
	}
	failed = func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	return failed, stop, nil
}

func (p *wmPeer) appendRate(ctx context.Context, writers int) (float64, error) {
	defer p.b.casePools()()
	db, err := p.open(writers, nil)
	if err != nil {
		return 0, err
	}
	pub, err := p.publisher(db)
	if err != nil {
		return 0, err
	}
	res, err := timedWriters(ctx, writers, p.sz.appendDuration, func(ctx context.Context, w, k int) error {
		msg, err := wmMessage(ctx, fmt.Sprintf("peer-append-%d", w), k)
		if err != nil {
			return err
		}
		return pub.Publish(wmAppendTopic, msg)
	}, nil)
	return float64(len(res.latencies)) / res.elapsed.Seconds(), err
}

// fill empties the backlog's table and publishes n messages into it, 500
// to an INSERT, offsets 1..n.
func (p *wmPeer) fill(ctx context.Context) (last int64, err error) {
	if _, err := p.setup.ExecContext(ctx, `TRUNCATE "watermill_`+wmBacklogTopic+`" RESTART IDENTITY`); err != nil {
		return 0, err
	}
	pub, err := p.publisher(p.setup)
	if err != nil {
		return 0, err
	}
	for done := 0; done < p.sz.events; {
		msgs := make([]*message.Message, min(500, p.sz.events-done))
		for i := range msgs {
			if msgs[i], err = wmMessage(ctx, fmt.Sprintf("agg-%d", (done+i)/peerBatch), done+i); err != nil {
				return 0, err
			}
		}
		if err := pub.Publish(wmBacklogTopic, msgs...); err != nil {
			return 0, fmt.Errorf("fill the queue: %w", err)
		}
		done += len(msgs)
	}
	if _, err := p.setup.ExecContext(ctx, `ANALYZE "watermill_`+wmBacklogTopic+`"`); err != nil {
		return 0, err
	}
	err = p.setup.QueryRowContext(ctx, `SELECT MAX("offset") FROM "watermill_`+wmBacklogTopic+`"`).Scan(&last)
	return last, err
}

func (p *wmPeer) catchUp(ctx context.Context, consumers int) (peerCatchup, error) {
	defer p.b.casePools()()
	var res peerCatchup
	last, err := p.fill(ctx)
	if err != nil {
		return res, err
	}
	if _, err := p.setup.ExecContext(ctx, "TRUNCATE peer_projection"); err != nil {
		return res, err
	}
	subs := make([]*wmsql.Subscriber, consumers)
	for i := range subs {
		if subs[i], err = p.subscriber(nil); err != nil {
			return res, err
		}
	}
	conflicts0 := p.conflicts.Load()
	start := time.Now()
	failed, stop, err := p.consume(ctx, subs, wmBacklogTopic, func(msg *message.Message) error {
		tx, ok := wmsql.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		_, err := tx.ExecContext(msg.Context(), p.upsert, msg.UUID)
		return err
	})
	if err != nil {
		return res, err
	}
	// Done when the last message's ack is committed: the queue is read in
	// offset order, a batch's rows locked, so every earlier one is too.
	for {
		var acked bool
		if err := p.setup.QueryRowContext(ctx, `SELECT acked FROM "watermill_`+wmBacklogTopic+`" WHERE "offset" = $1`, last).Scan(&acked); err != nil {
			return res, errors.Join(err, stop())
		}
		if acked {
			break
		}
		if err := failed(); err != nil {
			return res, errors.Join(fmt.Errorf("handler: %w", err), stop())
		}
		if !ctxsleep.Sleep(ctx, 2*time.Millisecond) {
			return res, errors.Join(ctx.Err(), stop())
		}
	}
	res.elapsed = time.Since(start)
	res.conflicts = p.conflicts.Load() - conflicts0
	if err := errors.Join(failed(), stop()); err != nil {
		return res, err
	}
	var rows, calls, unacked int64
	if err := p.setup.QueryRowContext(ctx, peerProjectionCount).Scan(&rows, &calls); err != nil {
		return res, err
	}
	if err := p.setup.QueryRowContext(ctx, `SELECT COUNT(*) FROM "watermill_`+wmBacklogTopic+`" WHERE NOT acked`).Scan(&unacked); err != nil {
		return res, err
	}
	if rows != int64(p.sz.events) || unacked != 0 {
		return res, fmt.Errorf("the projection holds %d rows, want %d; %d messages unacked", rows, p.sz.events, unacked)
	}
	res.dupCommitted = calls - rows
	return res, nil
}

func (p *wmPeer) wake(ctx context.Context) ([]time.Duration, error) {
	defer p.b.casePools()()
	wdb, err := p.open(1, nil)
	if err != nil {
		return nil, err
	}
	pub, err := p.publisher(wdb)
	if err != nil {
		return nil, err
	}
	sub, err := p.subscriber(nil)
	if err != nil {
		return nil, err
	}
	hits := make(chan hit, p.sz.wakeWarmup+p.sz.wakeAppends+16)
	failed, stop, err := p.consume(ctx, []*wmsql.Subscriber{sub}, wmWakeTopic, func(msg *message.Message) error {
		select {
		case hits <- hit{msg.UUID, time.Now()}:
		default:
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	lat, err := peerTimedAppends(ctx, p.sz, func(ctx context.Context, i int) (string, error) {
		msg, err := wmMessage(ctx, "peer-wake", i)
		if err != nil {
			return "", err
		}
		return msg.UUID, pub.Publish(wmWakeTopic, msg)
	}, hits)
	return lat, errors.Join(err, failed(), stop())
}

func (p *wmPeer) idle(ctx context.Context) (peerIdle, error) {
	defer p.b.casePools()()
	counter := &txCounter{}
	sub, err := p.subscriber(counter)
	if err != nil {
		return peerIdle{}, err
	}
	_, stop, err := p.consume(ctx, []*wmsql.Subscriber{sub}, wmWakeTopic, func(*message.Message) error { return nil })
	if err != nil {
		return peerIdle{}, err
	}
	ctxsleep.Sleep(ctx, 100*time.Millisecond) // its pool's connection is open, its loop polling
	m, err := measurePeerIdle(ctx, p.b, counter, p.sz.idleWindow)
	return m, errors.Join(err, stop())
}

// wmLogger is watermill's logger for the peer: errors counted (it logs
// and retries them) but while its consumers are stopped (their context
// cancelled), and printed with -v; the rest dropped.
type wmLogger struct {
	errors, conflicts *atomic.Int64
	stopping          *atomic.Bool
	verbose           bool
}

func (l wmLogger) Error(msg string, err error, fields watermill.LogFields) {
	when := ""
	if l.stopping.Load() {
		when = " (while stopping)"
	} else {
		l.errors.Add(1)
	}
	if l.verbose {
		fmt.Fprintf(os.Stderr, "watermill-sql%s: %s: %v %v\n", when, msg, err, fields)
	}
}

func (l wmLogger) Info(string, watermill.LogFields) {}
func (l wmLogger) Debug(msg string, _ watermill.LogFields) {
	if strings.HasPrefix(msg, "Deadlock during querying message") {
		l.conflicts.Add(1)
	}
}

func (l wmLogger) Trace(string, watermill.LogFields)                {}
func (l wmLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
