package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// orderedBatch is the batch size of scenario 11.
const orderedBatch = 100

// orderedParkedEvery is how often (in events) the parked aggregate of
// scenario 11 has an event in the feed: each is held.
const orderedParkedEvery = 1_000

// countingLot counts the parking lot's ParkedHeads lookups.
type countingLot struct {
	*subscriptions.GormParkingLot
	lookups atomic.Int64
}

func (l *countingLot) ParkedHeads(ctx context.Context, subscriber string) ([]subscriptions.ParkedEvent, error) {
	l.lookups.Add(1)
	return l.GormParkingLot.ParkedHeads(ctx, subscriber)
}

// runOrdered: scenario 11. A catch-up on Postgres with a parking lot and a
// per-event upsert projection, without WithOrderedParking (the baseline),
// with it and nothing parked, and with it and one aggregate parked, whose
// events in the feed (one in orderedParkedEvery) are held. The variants
// run one after the other, twice in alternating order; each figure is its
// better run. The lookups row counts ParkedHeads per batch: the run loop
// looks the queues up only when it cannot know them (its first batch, and
// after a wait or another replica's turn), not per batch.
func runOrdered(ctx context.Context, b *bench) ([]Row, error) {
	n := b.sizes().orderedEvents
	_, db, store, err := b.newPGStore(ctx, "ordered", 2)
	if err != nil {
		return nil, err
	}
	// Position 1 is the parked aggregate's first event, which the third
	// variant parks; the others start after it too.
	head1 := domain.NewEventEnvelope[any](benchPayload{Note: "subbench"}, "agg-parked", "bench.happened", 0)
	if err := store.Append(ctx, "agg-parked", -1, head1); err != nil {
		return nil, err
	}
	held := 0
	for done := 0; done < n; done += 20 {
		if err := store.Append(ctx, fmt.Sprintf("agg-%d", done/20), -1, makeEvents(min(20, n-done), done)...); err != nil {
			return nil, err
		}
		if (done+20)%orderedParkedEvery == 0 {
			if err := store.Append(ctx, "agg-parked", -1, makeEvents(1, done)...); err != nil {
				return nil, err
			}
			held++
		}
	}
	headPos, err := store.HeadPosition(ctx)
	if err != nil {
		return nil, err
	}
	if err := execAll(db,
		`CREATE TABLE ordered_projection (event_id text NOT NULL PRIMARY KEY, aggregate_id text NOT NULL, position bigint NOT NULL)`,
		`ANALYZE`,
	); err != nil {
		return nil, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, err
	}
	gormLot, err := subscriptions.NewGormParkingLot(db)
	if err != nil {
		return nil, err
	}
	lot := &countingLot{GormParkingLot: gormLot}
	stored, err := store.GetEventByID(ctx, head1.ID)
	if err != nil {
		return nil, err
	}
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		return subscriptions.TxFromContext(ctx).Exec(`INSERT INTO ordered_projection (event_id, aggregate_id, position) VALUES (?, ?, ?)
			ON CONFLICT (event_id) DO UPDATE SET aggregate_id = excluded.aggregate_id, position = excluded.position`,
			ev.ID, ev.AggregateID, ev.Position).Error
	}
	variants := []string{"without", "nothing parked", "one aggregate parked"}
	best := map[string]float64{}
	lookups := map[string]int64{}
	for round := range 2 {
		order := variants
		if round == 1 {
			order = []string{variants[2], variants[1], variants[0]}
		}
		for _, v := range order {
			if err := db.Exec("TRUNCATE ordered_projection").Error; err != nil {
				return nil, err
			}
			name := fmt.Sprintf("ordered-%d-%s", round, strings.ReplaceAll(v, " ", "-"))
			if err := cps.Reset(ctx, name, 1); err != nil {
				return nil, err
			}
			opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(orderedBatch), subscriptions.WithLogger(b.libLogger()),
				subscriptions.WithParkingLot(lot)}
			want := headPos - 1
			if v != "without" {
				opts = append(opts, subscriptions.WithOrderedParking())
			}
			if v == "one aggregate parked" {
				if err := lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: name, EventID: stored.ID, EventType: stored.EventType,
					Position: stored.Position, Error: "subbench: parked", Attempts: 1, AggregateID: stored.AggregateID}); err != nil {
					return nil, err
				}
				want -= int64(held)
			}
			before := lot.lookups.Load()
			start := time.Now()
			if err := rebuildTo(ctx, store, cps, name, headPos, handler, opts); err != nil {
				return nil, fmt.Errorf("%s: %w", v, err)
			}
			rate := float64(headPos-1) / time.Since(start).Seconds()
			var rows int64
			if err := db.Raw("SELECT COUNT(*) FROM ordered_projection").Scan(&rows).Error; err != nil {
				return nil, err
			}
			if rows != want {
				return nil, fmt.Errorf("%s: the projection holds %d rows, want %d", v, rows, want)
			}
			if v == "one aggregate parked" {
				if h, err := lot.CountHeld(ctx, name); err != nil || h != held {
					return nil, fmt.Errorf("%s: %d events held (%v), want %d", v, h, err, held)
				}
			}
			b.logf("  %s: %.0f ev/s", v, rate)
			best[v] = max(best[v], rate)
			lookups[v] = max(lookups[v], lot.lookups.Load()-before)
		}
	}
	batches := float64(headPos-1) / orderedBatch
	bname := "the same catch-up without WithOrderedParking"
	note := fmt.Sprintf("%d events on Postgres, batch %d, one upsert per event; each variant ran twice, alternating order; best run each", headPos-1, orderedBatch)
	budget := "one per batch: the most a batch may look up while a queue exists"
	perBatch := func(v string) Row {
		r := newRow("queue lookups per batch, "+v, float64(lookups[v])/batches, 1, "lookups", budget).
			note(fmt.Sprintf("%d in %.0f batches (the first batch of a Run, and any after a wait, look up)", lookups[v], batches))
		return r.goal("<= 1", float64(lookups[v]) <= batches)
	}
	return []Row{
		newRow("ordered parking, nothing parked", best["nothing parked"], best["without"], "ev/s", bname).note(note),
		newRow(fmt.Sprintf("ordered parking, one aggregate parked (%d of its events held)", held), best["one aggregate parked"], best["without"], "ev/s", bname),
		perBatch("nothing parked"),
		perBatch("one aggregate parked"),
	}, nil
}
