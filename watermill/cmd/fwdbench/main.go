// Command fwdbench compares three ways of forwarding an event feed on
// Postgres to NATS JetStream, in one run, each on a schema and a stream
// of its own:
//
//   - forwarder: this module's Forwarder as a subscriber's batch handler
//     (GormEventStore, GormCheckpointStore, PostgresListener wake-ups,
//     natsjs.Publisher: async batches, Nats-Msg-Id, one message per
//     aggregate in flight);
//   - watermill-sql: watermill's own outbox, watermill-sql/v4's Postgres
//     publisher and subscriber with the forwarder component
//     (github.com/ThreeDotsLabs/watermill/components/forwarder), publishing
//     through watermill-nats' JetStream publisher with TrackMsgId;
//   - hand loop: read the feed (GormEventStore.ReadAfter), publish it all
//     asynchronously with Nats-Msg-Id, wait for the acks, update a
//     checkpoint row; poll when idle.
//
// Each first drains a backlog (-events, appended before it starts:
// throughput), then forwards events appended live at -rate per second
// (-live of them: end-to-end latency, from just before the append to a
// JetStream consumer's receipt, p50/p99).
//
//	cd watermill && go run ./cmd/fwdbench [-events 50000] [-aggregates 500] [-batch 500]
//
// Postgres from SUBSCRIPTIONS_POSTGRES_DSN, NATS from SUBSCRIPTIONS_NATS_URL
// (the test defaults otherwise).
package main

import (
	"cmp"
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	forward "github.com/eventfeed/subscriptions/watermill"
	"github.com/eventfeed/subscriptions/watermill/natsjs"
)

var (
	events     = flag.Int("events", 50_000, "backlog to drain")
	aggregates = flag.Int("aggregates", 500, "aggregates the events are spread over")
	batch      = flag.Int("batch", 500, "batch size (the subscriber's, watermill-sql's SubscribeBatchSize, the hand loop's)")
	live       = flag.Int("live", 3_000, "events appended live for the latency figures")
	rate       = flag.Int("rate", 500, "live appends per second")
	only       = flag.String("only", "", "comma-separated contenders to run (forwarder, watermill-sql, hand-loop); all by default")
	rounds     = flag.Int("rounds", 1, "rounds, the contenders taking turns in each; the median round of each is reported")
	stall      = flag.Duration("stall", 3*time.Minute, "a contender whose backlog has not drained by then is reported stalled")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fwdbench:", err)
		os.Exit(1)
	}
}

// contender is one way of forwarding.
type contender struct {
	name string
	// start begins forwarding from the schema's feed to the stream's
	// subject prefix; the returned stop ends it.
	start func(ctx context.Context, env *env) (stop func() error, err error)
	// appender appends events for the contender.
	appender func(env *env) (appendFunc, error)
}

// appendFunc appends evs of one aggregate, in order.
type appendFunc func(ctx context.Context, agg string, evs []domain.EventEnvelope[any]) error

// env is one contender's schema and stream.
type env struct {
	dsn     string
	db      *gorm.DB
	store   *infrastructure.GormEventStore
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string
}

type result struct {
	name       string
	drain      time.Duration
	throughput float64
	p50, p99   time.Duration
	received   int
	stalled    bool // the backlog did not drain within -stall
}

func run() error {
	ctx := context.Background()
	baseDSN := cmp.Or(os.Getenv("SUBSCRIPTIONS_POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	natsURL := cmp.Or(os.Getenv("SUBSCRIPTIONS_NATS_URL"), "nats://127.0.0.1:4222")
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	all := []contender{forwarderContender(), watermillSQLContender(), handLoopContender()}
	fmt.Printf("fwdbench: %d events over %d aggregates, batch %d; live %d at %d/s; load average %s\n", *events, *aggregates, *batch, *live, *rate, loadavg())
	var picked []contender
	for _, c := range all {
		if *only == "" || slices.Contains(strings.Split(*only, ","), c.name) {
			picked = append(picked, c)
		}
	}
	runs := make([][]result, len(picked))
	for round := range *rounds {
		for i, c := range picked {
			r, err := runOne(ctx, c, baseDSN, nc, js)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if r.stalled {
				continue
			}
			runs[i] = append(runs[i], r)
			fmt.Printf("  round %d %-14s drained %d in %v: %6.0f events/s; live latency p50 %v p99 %v\n", round+1, r.name, *events,
				r.drain.Round(time.Millisecond), r.throughput, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
		}
	}
	fmt.Printf("fwdbench: load average %s; median of %d round(s):\n", loadavg(), *rounds)
	medians := map[string]result{}
	for i, c := range picked {
		rs := slices.Clone(runs[i])
		if len(rs) == 0 {
			fmt.Printf("  %-14s stalled in every round\n", c.name)
			continue
		}
		slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.throughput, b.throughput) })
		m := rs[len(rs)/2]
		medians[c.name] = m
		fmt.Printf("  %-14s %6.0f events/s; live latency p50 %v p99 %v\n", m.name, m.throughput, m.p50.Round(10*time.Microsecond), m.p99.Round(10*time.Microsecond))
	}
	f, ok := medians["forwarder"]
	if w, ok2 := medians["watermill-sql"]; ok && ok2 {
		fmt.Printf("forwarder / watermill-sql: %.2f\n", f.throughput/w.throughput)
	}
	if h, ok2 := medians["hand-loop"]; ok && ok2 {
		fmt.Printf("forwarder / hand loop: %.2f\n", f.throughput/h.throughput)
	}
	return nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func runOne(ctx context.Context, c contender, baseDSN string, nc *nats.Conn, js jetstream.JetStream) (result, error) {
	sfx := fmt.Sprintf("%x", rand.Uint64())[:10]
	schema := "fwdbench_" + sfx
	admin, err := stdsql.Open("pgx", baseDSN)
	if err != nil {
		return result{}, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return result{}, err
	}
	defer admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	u, err := url.Parse(baseDSN)
	if err != nil {
		return result{}, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	e := &env{dsn: u.String(), nc: nc, js: js, stream: "FWDBENCH_" + sfx, subject: "fwdbench." + sfx}
	if e.db, err = gorm.Open(postgres.Open(e.dsn), &gorm.Config{Logger: logger.Discard}); err != nil {
		return result{}, err
	}
	sqlDB, _ := e.db.DB()
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(8)
	if e.store, err = infrastructure.NewGormEventStore(e.db); err != nil {
		return result{}, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.subject + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		return result{}, err
	}
	defer js.DeleteStream(context.Background(), e.stream)

	appendEvs, err := c.appender(e)
	if err != nil {
		return result{}, err
	}
	cons, err := newConsumer(ctx, e, *events+*live)
	if err != nil {
		return result{}, err
	}
	defer cons.stop()

	// The backlog.
	if err := appendN(ctx, appendEvs, *events, false, 0); err != nil {
		return result{}, err
	}
	started := time.Now()
	stop, err := c.start(ctx, e)
	if err != nil {
		return result{}, err
	}
	if err := cons.waitFor(*events, *stall); err != nil {
		// Reported, not fatal: watermill-sql's subscriber reads only rows
		// older than the oldest transaction open on the server, so a
		// transaction left open anywhere on a shared server stalls it.
		oldest := "unknown"
		var age stdsql.NullString
		if admin.QueryRowContext(ctx, "SELECT (now() - min(xact_start))::text FROM pg_stat_activity WHERE xact_start IS NOT NULL").Scan(&age) == nil && age.Valid {
			oldest = age.String
		}
		fmt.Printf("  %s stalled: %v; the oldest transaction open on the server is %s old\n", c.name, err, oldest)
		return result{name: c.name, stalled: true, received: cons.count()}, stop()
	}
	drain := time.Since(started)
	// Live appends.
	if err := appendN(ctx, appendEvs, *live, true, *rate); err != nil {
		_ = stop()
		return result{}, err
	}
	if err := cons.waitFor(*events+*live, 5*time.Minute); err != nil {
		_ = stop()
		return result{}, err
	}
	if err := stop(); err != nil {
		return result{}, err
	}
	lat := cons.latencies()
	r := result{name: c.name, drain: drain, throughput: float64(*events) / drain.Seconds(), received: cons.count()}
	if len(lat) > 0 {
		r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return r, nil
}

// appendN appends n events over the aggregates, one to four at a time;
// with perSecond > 0 paced at that rate, each payload then carrying its
// append time for the latency figures.
func appendN(ctx context.Context, appendEvs appendFunc, n int, timed bool, perSecond int) error {
	var tick <-chan time.Time
	per := 1
	if perSecond > 0 {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		tick = t.C
		per = max(1, perSecond/100)
	}
	const writers = 4
	work := make(chan []int, writers)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for chunk := range work {
				for _, k := range chunk {
					agg := fmt.Sprintf("order-%d", w+writers*rand.IntN(*aggregates/writers))
					evs := make([]domain.EventEnvelope[any], k)
					now := time.Now().UnixNano()
					for i := range evs {
						p := map[string]any{"agg": agg}
						if timed {
							p["t"] = now
						}
						evs[i] = domain.NewEventEnvelope[any](p, agg, "order.placed", 0)
					}
					if err := appendEvs(ctx, agg, evs); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	sent := 0
	for sent < n {
		var chunk []int
		for got := 0; got < per && sent < n; {
			k := min(1+rand.IntN(4), n-sent)
			chunk = append(chunk, k)
			sent += k
			got += k
		}
		if tick != nil {
			<-tick
		}
		select {
		case work <- chunk:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// consumer reads the stream from its start and records each message's
// end-to-end latency.
type consumer struct {
	cc   jetstream.ConsumeContext
	n    atomic.Int64
	mu   sync.Mutex
	lat  []time.Duration
	done chan struct{}
	want int64
	once sync.Once
}

func newConsumer(ctx context.Context, e *env, want int) (*consumer, error) {
	oc, err := e.js.OrderedConsumer(ctx, e.stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	c := &consumer{done: make(chan struct{}), want: int64(want)}
	c.cc, err = oc.Consume(func(m jetstream.Msg) {
		now := time.Now().UnixNano()
		var p struct {
			T int64 `json:"t"`
		}
		if json.Unmarshal(m.Data(), &p) == nil && p.T > 0 {
			c.mu.Lock()
			c.lat = append(c.lat, time.Duration(now-p.T))
			c.mu.Unlock()
		}
		if c.n.Add(1) >= c.want {
			c.once.Do(func() { close(c.done) })
		}
	})
	return c, err
}

func (c *consumer) count() int { return int(c.n.Load()) }

func (c *consumer) waitFor(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for c.count() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("the consumer got %d of %d messages within %v", c.count(), n, limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

func (c *consumer) latencies() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := slices.Clone(c.lat)
	slices.Sort(l)
	return l
}

func (c *consumer) stop() { c.cc.Stop() }

func storeAppender(e *env) (appendFunc, error) {
	return func(ctx context.Context, agg string, evs []domain.EventEnvelope[any]) error {
		return e.store.Append(ctx, agg, -1, evs...)
	}, nil
}

func forwarderContender() contender {
	return contender{name: "forwarder", appender: storeAppender, start: func(ctx context.Context, e *env) (func() error, error) {
		pub, err := natsjs.NewPublisher(e.nc)
		if err != nil {
			return nil, err
		}
		fwd, err := forward.New(pub, forward.WithTopic(natsjs.SubjectPerAggregate(e.subject)))
		if err != nil {
			return nil, err
		}
		cps, err := subscriptions.NewGormCheckpointStore(e.db)
		if err != nil {
			return nil, err
		}
		quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		l, err := subscriptions.NewPostgresListener(e.dsn, subscriptions.WithListenerLogger(quiet))
		if err != nil {
			return nil, err
		}
		h := fwd.BatchHandler()
		var calls, evs, inHandler atomic.Int64
		timed := func(ctx context.Context, batch []domain.EventEnvelope[any]) error {
			start := time.Now()
			err := h(ctx, batch)
			inHandler.Add(int64(time.Since(start)))
			calls.Add(1)
			evs.Add(int64(len(batch)))
			return err
		}
		began := time.Now()
		sub, err := subscriptions.NewSubscriber("fwdbench", e.store, cps, nil, subscriptions.WithBatchHandler(timed),
			subscriptions.WithBatchSize(*batch), subscriptions.WithWakeSignal(l.Subscribe()), subscriptions.WithLogger(quiet))
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 2)
		go func() { done <- l.Run(ctx) }()
		go func() { done <- sub.Run(ctx) }()
		return func() error {
			cancel()
			err := errors.Join(<-done, <-done)
			if os.Getenv("FWDBENCH_VERBOSE") != "" {
				fmt.Printf("    forwarder: %d handler calls, %.0f events each, %v of %v in the handler\n", calls.Load(), float64(evs.Load())/float64(max(1, calls.Load())), time.Duration(inHandler.Load()).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
			}
			return err
		}, nil
	}}
}

// outboxTopic is watermill-sql's forwarder topic (its messages table).
const outboxTopic = "outbox"

func watermillSQLContender() contender {
	var db *stdsql.DB
	return contender{
		name: "watermill-sql",
		appender: func(e *env) (appendFunc, error) {
			var err error
			if db, err = stdsql.Open("pgx", e.dsn); err != nil {
				return nil, err
			}
			db.SetMaxOpenConns(8)
			sqlPub, err := wmsql.NewPublisher(wmsql.BeginnerFromStdSQL(db), wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, watermill.NopLogger{})
			if err != nil {
				return nil, err
			}
			outbox := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: outboxTopic})
			subject := natsjs.SubjectPerAggregate(e.subject)
			return func(ctx context.Context, agg string, evs []domain.EventEnvelope[any]) error {
				msgs := make([]*message.Message, len(evs))
				for i, ev := range evs {
					payload, _ := json.Marshal(ev.Payload)
					msgs[i] = message.NewMessage(ev.ID, payload)
					msgs[i].Metadata = forward.Metadata(ctx, ev, "")
				}
				return outbox.Publish(subject(evs[0]), msgs...)
			}, nil
		},
		start: func(ctx context.Context, e *env) (func() error, error) {
			sqlSub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db), wmsql.SubscriberConfig{
				SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: *batch},
				OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
				InitializeSchema: true, PollInterval: 10 * time.Millisecond,
			}, watermill.NopLogger{})
			if err != nil {
				return nil, err
			}
			natsPub, err := wmnats.NewPublisherWithNatsConn(e.nc, wmnats.PublisherPublishConfig{
				Marshaler:         &wmnats.NATSMarshaler{},
				SubjectCalculator: wmnats.DefaultSubjectCalculator,
				JetStream:         wmnats.JetStreamConfig{TrackMsgId: true},
			}, watermill.NopLogger{})
			if err != nil {
				return nil, err
			}
			fwd, err := forwarder.NewForwarder(sqlSub, natsPub, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: outboxTopic})
			if err != nil {
				return nil, err
			}
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- fwd.Run(ctx) }()
			<-fwd.Running()
			return func() error {
				cancel()
				err := <-done
				_ = db.Close()
				return err
			}, nil
		},
	}
}

func handLoopContender() contender {
	return contender{name: "hand-loop", appender: storeAppender, start: func(ctx context.Context, e *env) (func() error, error) {
		js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4*(*batch)))
		if err != nil {
			return nil, err
		}
		if err := e.db.Exec("CREATE TABLE hand_checkpoint (name text PRIMARY KEY, position bigint NOT NULL)").Error; err != nil {
			return nil, err
		}
		if err := e.db.Exec("INSERT INTO hand_checkpoint VALUES ('hand', 0)").Error; err != nil {
			return nil, err
		}
		subject := natsjs.SubjectPerAggregate(e.subject)
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- func() error {
				var pos int64
				for ctx.Err() == nil {
					evs, err := e.store.ReadAfter(ctx, pos, *batch)
					if err != nil {
						return err
					}
					if len(evs) == 0 {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					futures := make([]jetstream.PubAckFuture, len(evs))
					for i, ev := range evs {
						data, _ := json.Marshal(ev.Payload)
						m := &nats.Msg{Subject: subject(ev), Data: data, Header: nats.Header{}}
						for k, v := range forward.Metadata(ctx, ev, "") {
							m.Header.Set(k, v)
						}
						if futures[i], err = js.PublishMsgAsync(m, jetstream.WithMsgID(ev.ID)); err != nil {
							return err
						}
					}
					for _, f := range futures {
						select {
						case <-f.Ok():
						case err := <-f.Err():
							return err
						case <-ctx.Done():
							return nil
						}
					}
					pos = evs[len(evs)-1].Position
					if err := e.db.WithContext(ctx).Exec("UPDATE hand_checkpoint SET position = ? WHERE name = 'hand'", pos).Error; err != nil {
						return err
					}
				}
				return nil
			}()
		}()
		return func() error {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}, nil
	}}
}
