// Command prometheus shows a subscriber's OpenTelemetry metrics scraped by
// Prometheus: the OpenTelemetry SDK with its Prometheus exporter, a
// /metrics endpoint, and a readiness endpoint over Subscriber.Healthy.
//
//	cd examples/prometheus
//	go run .                        # serves http://127.0.0.1:9464/{metrics,healthz,status} until Ctrl-C
//	go run . -once                  # one catch-up, prints the subscriptions_* series, exits
//
// It is a module of its own (go.mod beside this file) so that the SDK and
// the Prometheus client stay out of the library's dependencies: the
// library itself uses only the OpenTelemetry API, which does nothing until
// an application installs an SDK, as this one does with
// WithMeterProvider (or otel.SetMeterProvider, for every subscriber at
// once).
//
// The data: an embedded SQLite database in a temporary directory, a
// projection subscriber with a parking lot, and a writer appending a few
// events per second, one in twenty of which the handler refuses (parked
// after two quick retries). docs/observability.md lists the metrics.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "listen address of the HTTP server")
	once := flag.Bool("once", false, "append a batch of events, wait for the catch-up, print the subscriptions_* series and exit")
	plot := flag.String("plot", "", "instead: catch up on a ten-minute backlog, sampling Status, and draw the lag as an SVG into this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *plot != "" {
		err = plotCatchUp(ctx, *plot)
	} else {
		err = run(ctx, *addr, *once, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "prometheus example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string, once bool, out io.Writer) (err error) {
	// The SDK: a MeterProvider whose reader is the Prometheus exporter,
	// registered in a registry of our own (prometheus.DefaultRegisterer
	// would do as well).
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { err = errors.Join(err, meters.Shutdown(context.Background())) }()

	db, cleanup, err := openDatabase()
	if err != nil {
		return err
	}
	defer cleanup()
	store, checkpoints, lot, err := openStores(db)
	if err != nil {
		return err
	}
	notifier := subscriptions.NewInProcessNotifier()
	events := subscriptions.NewNotifyingEventStore(store, notifier.Notify)
	logs := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	sub, err := subscriptions.NewSubscriber("order-counts", store, checkpoints, handler,
		subscriptions.WithMeterProvider(meters),
		subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(2),
		subscriptions.WithRetryBackoff(10*time.Millisecond, 50*time.Millisecond),
		subscriptions.WithWakeSignal(notifier.Subscribe()), subscriptions.WithLogger(logs))
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	defer func() {
		stopRun()
		err = errors.Join(err, <-done)
	}()

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := sub.Healthy(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := sub.Status(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- server.Serve(ln) }()
	defer func() {
		_ = server.Close()
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
	}()
	base := "http://" + ln.Addr().String()

	if once {
		for i := range 40 {
			if err := appendOrder(ctx, events, i); err != nil {
				return err
			}
		}
		if err := waitCaughtUp(ctx, sub); err != nil {
			return err
		}
		return printSeries(ctx, base+"/metrics", out)
	}

	fmt.Fprintf(out, "serving %s/metrics, %s/healthz and %s/status; Ctrl-C to stop\n", base, base, base)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := appendOrder(ctx, events, i); err != nil {
			return err
		}
	}
}

// openDatabase opens a SQLite file in a new temporary directory; cleanup
// closes it and removes the directory.
func openDatabase() (db *gorm.DB, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "prometheus-example-")
	if err != nil {
		return nil, nil, err
	}
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	db, err = gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return db, func() {
		_ = sqlDB.Close()
		_ = os.RemoveAll(dir)
	}, nil
}

// openStores creates the event store, the checkpoint store, the parking
// lot and the projection table.
func openStores(db *gorm.DB) (*infrastructure.GormEventStore, *subscriptions.GormCheckpointStore, *subscriptions.GormParkingLot, error) {
	store, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return nil, nil, nil, err
	}
	checkpoints, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, nil, nil, err
	}
	lot, err := subscriptions.NewGormParkingLot(db)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := db.Exec("CREATE TABLE counts (event_type TEXT PRIMARY KEY, n INTEGER NOT NULL)").Error; err != nil {
		return nil, nil, nil, err
	}
	return store, checkpoints, lot, nil
}

// handler counts orders by type through the batch transaction and refuses
// the order.refused ones.
func handler(ctx context.Context, ev domain.EventEnvelope[any]) error {
	if ev.EventType == "order.refused" {
		return fmt.Errorf("order %s: refused by the handler", ev.AggregateID)
	}
	return subscriptions.TxFromContext(ctx).Exec(`INSERT INTO counts (event_type, n) VALUES (?, 1)
		ON CONFLICT (event_type) DO UPDATE SET n = counts.n + 1`, ev.EventType).Error
}

// appendOrder appends the i-th order event; every twentieth is one the
// handler refuses.
func appendOrder(ctx context.Context, store domain.EventStore, i int) error {
	typ := "order.placed"
	if i%20 == 19 {
		typ = "order.refused"
	}
	ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("order-%d", i), typ, 1)
	return store.Append(ctx, ev.AggregateID, 0, ev)
}

func waitCaughtUp(ctx context.Context, sub *subscriptions.Subscriber) error {
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := sub.Status(ctx)
		if err != nil {
			return err
		}
		if st.Lag == 0 && st.State == subscriptions.StateIdle {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the subscriber did not catch up within a minute: %+v", st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// printSeries scrapes url and prints the subscriptions_* series.
func printSeries(ctx context.Context, url string, out io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "subscriptions_") || strings.HasPrefix(line, "# HELP subscriptions_") || strings.HasPrefix(line, "# TYPE subscriptions_") {
			fmt.Fprintln(out, line)
		}
	}
	return nil
}
