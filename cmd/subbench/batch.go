package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// batchRebuildSize is the batch of every variant of scenario 10.
const batchRebuildSize = 1000

// runBatchHandler: scenario 10. A rebuild on Postgres with a multi-row
// upsert batch handler (WithBatchHandler), next to the per-event handler
// and a plain loop doing the same multi-row upserts in transactions of
// the same size; and a rebuild whose batch handler writes with COPY
// through the batch transaction (subscriptions.CopyFrom on GORM, the
// pgx.Tx's CopyFrom on pgx), next to a plain COPY loop of the same rows
// in transactions of the same size. The variants run one after the
// other, in an order rotating each round; each figure is its best run.
func runBatchHandler(ctx context.Context, b *bench) ([]Row, error) {
	n := b.sizes().batchEvents
	dsn, db, store, err := b.newPGStore(ctx, "batch", 4)
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
	pgxDB, err := pgxBackend.open(ctx, b, dsn, "", 4, nil)
	if err != nil {
		return nil, err
	}
	rawPool, err := b.openPgxPool(ctx, dsn, "", 1, nil)
	if err != nil {
		return nil, err
	}
	head := int64(n)
	// runOne rebuilds the projection from scratch with variant v and
	// returns its rate.
	runOne := func(v, name string) (float64, error) {
		if err := db.Exec("TRUNCATE batch_projection").Error; err != nil {
			return 0, err
		}
		start := time.Now()
		var err error
		switch v {
		case "plain loop":
			err = plainMultiRowLoop(ctx, db, store, name, head)
		case "batch handler":
			err = batchLibraryRebuild(ctx, store, cps, name, head, nil, func(ctx context.Context, events []domain.EventEnvelope[any]) error {
				return multiRowUpsert(subscriptions.TxFromContext(ctx), events)
			}, b)
		case "per-event handler":
			err = batchLibraryRebuild(ctx, store, cps, name, head, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				return multiRowUpsert(subscriptions.TxFromContext(ctx), []domain.EventEnvelope[any]{ev})
			}, nil, b)
		case "plain COPY loop":
			err = plainCopyLoop(ctx, rawPool, name, head)
		case "batch handler, COPY":
			err = batchLibraryRebuild(ctx, store, cps, name, head, nil, func(ctx context.Context, events []domain.EventEnvelope[any]) error {
				return copyProjection(events, func(rows pgx.CopyFromSource) (int64, error) {
					return subscriptions.CopyFrom(ctx, copyTable, copyColumns, rows)
				})
			}, b)
		default: // pgx: batch handler, COPY
			err = batchLibraryRebuild(ctx, pgxDB.store, pgxDB.cps, name, head, nil, func(ctx context.Context, events []domain.EventEnvelope[any]) error {
				tx := pgxstore.TxFromContext(ctx)
				if tx == nil {
					return errors.New("no batch transaction")
				}
				return copyProjection(events, func(rows pgx.CopyFromSource) (int64, error) {
					return tx.CopyFrom(ctx, copyTable, copyColumns, rows)
				})
			}, b)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", v, err)
		}
		rate := float64(n) / time.Since(start).Seconds()
		var rows int64
		if err := db.Raw("SELECT COUNT(*) FROM batch_projection").Scan(&rows).Error; err != nil {
			return 0, err
		}
		if rows != head {
			return 0, fmt.Errorf("%s: the projection holds %d rows, want %d", v, rows, head)
		}
		b.logf("  %s: %.0f ev/s", v, rate)
		return rate, nil
	}
	runName := func(round int, v string) string {
		return fmt.Sprintf("batch-%d-%s", round, strings.NewReplacer(" ", "-", ",", "", ":", "").Replace(v))
	}

	// Each library variant with a goal runs next to its plain loop
	// (either first), the pairs in rotating order; medians. The
	// per-event handler, far slower and without a goal, runs twice.
	type pairing struct{ library, plain string }
	pairings := []pairing{{"batch handler", "plain loop"}, {"batch handler, COPY", "plain COPY loop"}, {"pgx: batch handler, COPY", "plain COPY loop"}}
	rounds := 5
	if b.cfg.Quick {
		rounds = 1
	}
	lib := map[string][]float64{}
	plain := map[string][]float64{}
	ratios := map[string][]float64{}
	var perEvent []float64
	for round := range rounds {
		for k := range pairings {
			pg := pairings[(k+round)%len(pairings)]
			pair := []string{pg.plain, pg.library}
			if (round+k)%2 == 1 {
				pair[0], pair[1] = pair[1], pair[0]
			}
			got := map[string]float64{}
			for _, v := range pair {
				rate, err := runOne(v, runName(round, v)+"-"+strconv.Itoa(k))
				if err != nil {
					return nil, err
				}
				got[v] = rate
			}
			lib[pg.library] = append(lib[pg.library], got[pg.library])
			plain[pg.library] = append(plain[pg.library], got[pg.plain])
			ratios[pg.library] = append(ratios[pg.library], got[pg.library]/got[pg.plain])
		}
		if round < 2 {
			rate, err := runOne("per-event handler", runName(round, "per-event handler"))
			if err != nil {
				return nil, err
			}
			perEvent = append(perEvent, rate)
		}
	}
	pairNote := fmt.Sprintf("%d events rebuilt on Postgres, batch %d; each library variant in %d pairs with a run of its plain loop (either first), rotating; figure and baseline are the medians of the variant's runs and of the plain runs paired with them", n, batchRebuildSize, rounds)
	bname := fmt.Sprintf("a plain loop: ReadAfter %d events, one multi-row upsert and a checkpoint UPDATE per transaction, no library; run just before or after each run of the variant", batchRebuildSize)
	r := newRow("batch handler, multi-row upsert", median(lib["batch handler"]), median(plain["batch handler"]), "ev/s", bname).
		note(pairNote).note("batch handler, multi-row upsert: ratio of each pair of runs " + formatRatios(ratios["batch handler"]))
	rows := []Row{pairedGoal(r, ratios["batch handler"], 0.9)}
	rows = append(rows, newRow("per-event handler, one upsert per event", best(perEvent), median(plain["batch handler"]), "ev/s", bname).
		note(fmt.Sprintf("per-event handler: the better of %d runs", len(perEvent))))
	cname := fmt.Sprintf("a plain COPY loop: pgx, the raw reader's SELECT of %d events, one COPY of their rows and a checkpoint UPDATE per transaction, no library; run just before or after each run of the variant", batchRebuildSize)
	for _, v := range []string{"batch handler, COPY", "pgx: batch handler, COPY"} {
		label := "batch handler, COPY (subscriptions.CopyFrom)"
		if v != "batch handler, COPY" {
			label = "pgx: batch handler, COPY (the pgx.Tx's CopyFrom)"
		}
		r := newRow(label, median(lib[v]), median(plain[v]), "ev/s", cname).
			note(pairNote).note(fmt.Sprintf("%s: ratio of each pair of runs %s", label, formatRatios(ratios[v])))
		rows = append(rows, pairedGoal(r, ratios[v], 0.9))
	}
	return rows, nil
}

// The projection's table and columns as the COPY variants write them.
var (
	copyTable   = pgx.Identifier{"batch_projection"}
	copyColumns = []string{"event_id", "aggregate_id", "position"}
)

// copyProjection writes events' projection rows with one COPY (copyFrom).
func copyProjection(events []domain.EventEnvelope[any], copyFrom func(rows pgx.CopyFromSource) (int64, error)) error {
	n, err := copyFrom(pgx.CopyFromSlice(len(events), func(i int) ([]any, error) {
		ev := events[i]
		return []any{ev.ID, ev.AggregateID, ev.Position}, nil
	}))
	if err == nil && n != int64(len(events)) {
		err = fmt.Errorf("copied %d rows of %d", n, len(events))
	}
	return err
}

// plainCopyLoop is the COPY variants' baseline: on one pgx connection, a
// transaction per batch that reads it as the raw reader does
// (rawReadBatch), writes its rows with one COPY and advances a checkpoint.
func plainCopyLoop(ctx context.Context, pool *pgxpool.Pool, name string, head int64) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "INSERT INTO bench_checkpoint (name, position, updated_at) VALUES ($1, 0, $2)", name, time.Now().UTC()); err != nil {
		return err
	}
	var pos int64
	for pos < head {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			events, err := rawReadBatch(ctx, tx, pos, batchRebuildSize)
			if err != nil {
				return err
			}
			if len(events) == 0 {
				return fmt.Errorf("the feed ended at %d before the head %d", pos, head)
			}
			if err := copyProjection(events, func(rows pgx.CopyFromSource) (int64, error) {
				return tx.CopyFrom(ctx, copyTable, copyColumns, rows)
			}); err != nil {
				return err
			}
			last := events[len(events)-1].Position
			if _, err := tx.Exec(ctx, "UPDATE bench_checkpoint SET position = $1, updated_at = $2 WHERE name = $3", last, time.Now().UTC(), name); err != nil {
				return err
			}
			pos = last
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
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
