package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// batchRebuildSize is the batch of every variant of scenario 10.
const batchRebuildSize = 1000

// runBatchHandler: scenario 10. A rebuild on Postgres with a multi-row
// upsert batch handler (WithBatchHandler), next to the per-event handler
// and a plain loop doing the same multi-row upserts in transactions of
// the same size. The variants run one after the other, twice in
// alternating order; each figure is its better run.
func runBatchHandler(ctx context.Context, b *bench) ([]Row, error) {
	n := b.sizes().batchEvents
	_, db, store, err := b.newPGStore(ctx, "batch", 4)
	if err != nil {
		return nil, err
	}
	if err := fillStore(ctx, store, n, 20); err != nil {
		return nil, err
	}
	if err := execAll(db,
		`CREATE TABLE batch_projection (event_id text NOT NULL PRIMARY KEY, aggregate_id text NOT NULL, position bigint NOT NULL)`,
		`CREATE TABLE bench_checkpoint (name text NOT NULL PRIMARY KEY, position bigint NOT NULL, updated_at timestamp)`,
		`ANALYZE`,
	); err != nil {
		return nil, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, err
	}
	head := int64(n)
	variants := []string{"plain loop", "batch handler", "per-event handler"}
	best := map[string]float64{}
	for round := range 2 {
		order := variants
		if round == 1 {
			order = []string{variants[2], variants[1], variants[0]}
		}
		for _, v := range order {
			if err := db.Exec("TRUNCATE batch_projection").Error; err != nil {
				return nil, err
			}
			name := fmt.Sprintf("batch-%d-%s", round, strings.ReplaceAll(v, " ", "-"))
			start := time.Now()
			switch v {
			case "plain loop":
				err = plainMultiRowLoop(ctx, db, store, name, head)
			case "batch handler":
				err = batchLibraryRebuild(ctx, store, cps, name, head, nil, func(ctx context.Context, events []domain.EventEnvelope[any]) error {
					return multiRowUpsert(subscriptions.TxFromContext(ctx), events)
				}, b)
			default:
				err = batchLibraryRebuild(ctx, store, cps, name, head, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					return multiRowUpsert(subscriptions.TxFromContext(ctx), []domain.EventEnvelope[any]{ev})
				}, nil, b)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v, err)
			}
			rate := float64(n) / time.Since(start).Seconds()
			var rows int64
			if err := db.Raw("SELECT COUNT(*) FROM batch_projection").Scan(&rows).Error; err != nil {
				return nil, err
			}
			if rows != head {
				return nil, fmt.Errorf("%s: the projection holds %d rows, want %d", v, rows, head)
			}
			b.logf("  %s: %.0f ev/s", v, rate)
			best[v] = max(best[v], rate)
		}
	}
	bname := fmt.Sprintf("a plain loop: ReadAfter %d events, one multi-row upsert and a checkpoint UPDATE per transaction, no library", batchRebuildSize)
	note := fmt.Sprintf("%d events rebuilt on Postgres, batch %d; each variant ran twice, alternating order; best run each", n, batchRebuildSize)
	r := newRow("batch handler, multi-row upsert", best["batch handler"], best["plain loop"], "ev/s", bname).note(note)
	rows := []Row{r.goal(">= 0.9", r.Ratio != nil && *r.Ratio >= 0.9)}
	rows = append(rows, newRow("per-event handler, one upsert per event", best["per-event handler"], best["plain loop"], "ev/s", bname))
	return rows, nil
}

// multiRowUpsert writes events with one INSERT.
func multiRowUpsert(tx *gorm.DB, events []domain.EventEnvelope[any]) error {
	if tx == nil {
		return errors.New("no batch transaction")
	}
	var sb strings.Builder
	sb.WriteString("INSERT INTO batch_projection (event_id, aggregate_id, position) VALUES ")
	args := make([]any, 0, 3*len(events))
	for i, ev := range events {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?)")
		args = append(args, ev.ID, ev.AggregateID, ev.Position)
	}
	sb.WriteString(" ON CONFLICT (event_id) DO UPDATE SET aggregate_id = excluded.aggregate_id, position = excluded.position")
	return tx.Exec(sb.String(), args...).Error
}

// plainMultiRowLoop is the baseline: read a batch, upsert it with one
// statement and advance a checkpoint, in one plain transaction.
func plainMultiRowLoop(ctx context.Context, db *gorm.DB, store domain.EventStore, name string, head int64) error {
	if err := db.Exec(`INSERT INTO bench_checkpoint (name, position, updated_at) VALUES (?, 0, ?)`, name, time.Now().UTC()).Error; err != nil {
		return err
	}
	var pos int64
	for pos < head {
		events, err := store.ReadAfter(ctx, pos, batchRebuildSize)
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return fmt.Errorf("the feed ended at %d before the head %d", pos, head)
		}
		last := events[len(events)-1].Position
		err = db.WithContext(context.WithoutCancel(ctx)).Transaction(func(tx *gorm.DB) error {
			if err := multiRowUpsert(tx, events); err != nil {
				return err
			}
			return tx.Exec("UPDATE bench_checkpoint SET position = ?, updated_at = ? WHERE name = ?", last, time.Now().UTC(), name).Error
		})
		if err != nil {
			return err
		}
		pos = last
	}
	return nil
}

// batchLibraryRebuild runs a subscriber from 0 until its checkpoint
// reaches head.
func batchLibraryRebuild(ctx context.Context, store domain.EventStore, cps subscriptions.CheckpointStore, name string, head int64,
	h subscriptions.Handler, bh subscriptions.BatchHandler, b *bench) error {
	opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(batchRebuildSize), subscriptions.WithLogger(b.libLogger())}
	if bh != nil {
		opts = append(opts, subscriptions.WithBatchHandler(bh))
	}
	return rebuildTo(ctx, store, cps, name, head, h, opts)
}

// rebuildTo runs a subscriber with opts until its checkpoint reaches head.
func rebuildTo(ctx context.Context, store domain.EventStore, cps subscriptions.CheckpointStore, name string, head int64,
	h subscriptions.Handler, opts []subscriptions.SubscriberOption) error {
	sub, err := subscriptions.NewSubscriber(name, store, cps, h, opts...)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- sub.Run(rctx) }()
	for {
		pos, err := cps.Position(ctx, name)
		if err != nil {
			cancel()
			return errors.Join(err, <-errc)
		}
		if pos >= head {
			break
		}
		if !ctxsleep.Sleep(ctx, time.Millisecond) {
			cancel()
			return errors.Join(ctx.Err(), <-errc)
		}
	}
	cancel()
	return <-errc
}
