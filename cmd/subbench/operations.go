package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// operationsBatch is the batch size of scenario 12.
const operationsBatch = 100

// runOperations: scenario 12, the operator's tools on Postgres, each
// beside what it replaces. A catch-up of the feed delivered live (a name's
// first run), as re-deliveries (after a reset: DeliveryFrom reads the mark
// with the checkpoint's lock) and as a first-run catch-up
// (WithFirstRunCatchUp), twice in alternating order, best run each, with a
// per-event upsert that reads DeliveryFrom. Then Repartition of a 4-
// partition name to 8, with one partition behind by a batch's worth of
// events, against the rebuild under a new name it spares; and Pause with 4
// replicas busy, against one batch of the same replicas (Pause waits for
// the batches in flight, and returns once none can commit).
func runOperations(ctx context.Context, b *bench) ([]Row, error) {
	n := b.sizes().orderedEvents
	_, db, store, err := b.newPGStore(ctx, "operations", 6)
	if err != nil {
		return nil, err
	}
	if err := fillStore(ctx, store, n, 20); err != nil {
		return nil, err
	}
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return nil, err
	}
	if err := execAll(db,
		`CREATE TABLE operations_projection (event_id text NOT NULL PRIMARY KEY, position bigint NOT NULL, replay boolean NOT NULL)`,
		`ANALYZE`,
	); err != nil {
		return nil, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, err
	}
	var replays atomic.Int64
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		replay := subscriptions.DeliveryFrom(ctx).Replay()
		if replay {
			replays.Add(1)
		}
		return subscriptions.TxFromContext(ctx).Exec(`INSERT INTO operations_projection (event_id, position, replay) VALUES (?, ?, ?)
			ON CONFLICT (event_id) DO UPDATE SET position = excluded.position, replay = excluded.replay`, ev.ID, ev.Position, replay).Error
	}
	opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(operationsBatch), subscriptions.WithLogger(b.libLogger())}

	// The three deliveries.
	variants := []string{"live", "re-delivery", "first-run catch-up"}
	best := map[string]float64{}
	for round := range 2 {
		order := slices.Clone(variants)
		if round == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			if err := db.Exec("TRUNCATE operations_projection").Error; err != nil {
				return nil, err
			}
			name := fmt.Sprintf("operations-%d-%d", round, slices.Index(variants, v))
			vopts := opts
			switch v {
			case "re-delivery":
				// A name that has handled the feed, reset to 0.
				if err := cps.Reset(ctx, name, head); err != nil {
					return nil, err
				}
				if err := cps.Reset(ctx, name, 0); err != nil {
					return nil, err
				}
			case "first-run catch-up":
				vopts = append(slices.Clone(opts), subscriptions.WithFirstRunCatchUp(0))
			}
			replays.Store(0)
			start := time.Now()
			if err := rebuildTo(ctx, store, cps, name, head, handler, vopts); err != nil {
				return nil, fmt.Errorf("%s: %w", v, err)
			}
			rate := float64(head) / time.Since(start).Seconds()
			if want := map[bool]int64{true: 0, false: head}[v == "live"]; replays.Load() != want {
				return nil, fmt.Errorf("%s: %d calls read as a replay, want %d", v, replays.Load(), want)
			}
			b.logf("  %s: %.0f ev/s", v, rate)
			best[v] = max(best[v], rate)
		}
	}
	rows := []Row{
		newRow("re-deliveries after a reset (DeliveryFrom)", best["re-delivery"], best["live"], "ev/s", "the same catch-up delivered live").
			note(fmt.Sprintf("%d events, batch %d, one upsert per event reading DeliveryFrom; each twice, alternating order, best run each", head, operationsBatch)).
			goal(">= 0.95", best["re-delivery"] >= 0.95*best["live"]),
		newRow("first-run catch-up (WithFirstRunCatchUp)", best["first-run catch-up"], best["live"], "ev/s", "the same catch-up delivered live").
			goal(">= 0.95", best["first-run catch-up"] >= 0.95*best["live"]),
	}

	repart, err := measureRepartition(ctx, b, store, cps, head, handler, opts)
	if err != nil {
		return nil, fmt.Errorf("repartition: %w", err)
	}
	pause, err := measurePause(ctx, b, store, cps, handler, opts)
	if err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	return append(append(rows, repart...), pause...), nil
}

// measureRepartition times Repartition of a name with 4 partitions, one
// operationsBatch events behind the others, to 8, against a rebuild of the
// feed under a new name with 8 partitions (what a change of count took
// before).
func measureRepartition(ctx context.Context, b *bench, store domain.EventStore, cps *subscriptions.GormCheckpointStore, head int64,
	handler subscriptions.Handler, opts []subscriptions.SubscriberOption) ([]Row, error) {
	const name = "operations-repartition"
	four := append(slices.Clone(opts), subscriptions.WithPartitions(4))
	sub, err := subscriptions.NewSubscriber(name, store, cps, handler, four...)
	if err != nil {
		return nil, err
	}
	if err := runCaughtUp(ctx, sub); err != nil {
		return nil, err
	}
	// Partition 0 a batch behind (as a partition whose batch is slow is).
	behind := fmt.Sprintf("%s/partition-0-of-4", name)
	at, err := cps.Position(ctx, behind)
	if err != nil {
		return nil, err
	}
	if err := cps.Reset(ctx, behind, max(at-4*operationsBatch, 0)); err != nil {
		return nil, err
	}
	lags, err := sub.PartitionLags(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := sub.Repartition(ctx, 8); err != nil {
		return nil, err
	}
	took := time.Since(start)
	eight := append(slices.Clone(opts), subscriptions.WithPartitions(8))
	rebuild, err := subscriptions.NewSubscriber(name+"-v2", store, cps, handler, eight...)
	if err != nil {
		return nil, err
	}
	start = time.Now()
	if err := runCaughtUp(ctx, rebuild); err != nil {
		return nil, err
	}
	rebuilt := time.Since(start)
	b.logf("  repartition 4 -> 8: %v (partition 0 %d behind); rebuild: %v", took, lags[0], rebuilt)
	return []Row{
		newRow("Repartition 4 -> 8 partitions", ms(took), ms(rebuilt), "ms", "a rebuild under a new name with 8 partitions").
			note(fmt.Sprintf("%d events; partition 0 %d events behind, caught up inside the repartition", head, lags[0])),
	}, nil
}

// measurePause times Pause with 4 replicas of a name catching up, against
// the median batch of those replicas, over several rounds.
func measurePause(ctx context.Context, b *bench, store domain.EventStore, cps *subscriptions.GormCheckpointStore,
	handler subscriptions.Handler, opts []subscriptions.SubscriberOption) ([]Row, error) {
	const rounds = 5
	var pauses, batches []time.Duration
	for round := range rounds {
		name := fmt.Sprintf("operations-pause-%d", round)
		start := time.Now()
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 4)
		var subs []*subscriptions.Subscriber
		for range 4 {
			sub, err := subscriptions.NewSubscriber(name, store, cps, handler, opts...)
			if err != nil {
				cancel()
				return nil, err
			}
			subs = append(subs, sub)
			go func() { errc <- sub.Run(rctx) }()
		}
		stop := func() error {
			cancel()
			var errs []error
			for range subs {
				if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}
		// Busy: wait until a few batches have committed.
		for {
			pos, err := cps.Position(ctx, name)
			if err != nil {
				return nil, errors.Join(err, stop())
			}
			if pos >= 5*operationsBatch {
				batches = append(batches, time.Since(start)/time.Duration(pos/operationsBatch))
				break
			}
			if !ctxsleep.Sleep(ctx, time.Millisecond) {
				return nil, errors.Join(ctx.Err(), stop())
			}
		}
		t0 := time.Now()
		err := subs[0].Pause(ctx, "subbench")
		pauses = append(pauses, time.Since(t0))
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		at, err := cps.Position(ctx, name)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		// Three batches' time later, nothing has committed.
		if !ctxsleep.Sleep(ctx, 3*batches[len(batches)-1]) {
			return nil, errors.Join(ctx.Err(), stop())
		}
		again, err := cps.Position(ctx, name)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		if err := stop(); err != nil {
			return nil, err
		}
		if again != at {
			return nil, fmt.Errorf("the checkpoint moved from %d to %d after Pause returned", at, again)
		}
	}
	slices.Sort(pauses)
	slices.Sort(batches)
	p50, batch := pauses[len(pauses)/2], batches[len(batches)/2]
	b.logf("  pause: p50 %v, batch %v", p50, batch)
	return []Row{
		newRow("Pause, 4 replicas catching up: time to return, p50", ms(p50), ms(batch), "ms", "one batch of those replicas (mean, median round)").
			note(fmt.Sprintf("%d rounds; the checkpoint does not move after Pause returns (checked)", rounds)),
	}, nil
}

// runCaughtUp runs sub until every partition of it has caught up.
func runCaughtUp(ctx context.Context, sub *subscriptions.Subscriber) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctxsleep.Sleep(wctx, time.Millisecond) {
			if lags, err := sub.PartitionLags(wctx); err == nil && slices.Max(lags) == 0 {
				return
			}
		}
	}()
	err := runUntil(ctx, sub, done, nil)
	cancel()
	<-done
	return err
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
