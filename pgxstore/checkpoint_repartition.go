package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

var _ subscriptions.Repartitioner = (*CheckpointStore)(nil)

// Repartition changes the layout in one transaction (see
// subscriptions.Repartitioner), as the GORM Postgres backend does: it
// creates the count's row and the missing rows of from (uncommitted: a
// batch creating one waits for the commit), locks the count's row first
// (as InitPartitions does) and then every row in name order, which waits
// for the batches in flight while the others skip them; catchUp reads the
// checkpoints under those locks, and reads the feed, in the transaction,
// and its apply gets the transaction from TxFromContext. When it returns, nothing of the transaction holds a lock
// any more (see onServer).
func (s *CheckpointStore) Repartition(ctx context.Context, marker string, from, to []string, count int64, catchUp subscriptions.RepartitionCatchUp) error {
	what := fmt.Sprintf("repartition %q", subscriptions.PauseKey(marker))
	all := append(append([]string{marker}, from...), to...)
	slices.Sort(all)
	all = slices.Compact(all)
	for _, name := range all {
		if err := subscriptions.CheckSubscriberName(name); err != nil {
			return fmt.Errorf("pgxstore: %s: %w", what, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	err := s.onServer(ctx, func(tctx context.Context, tx pgx.Tx) error {
		now := time.Now().UTC()
		if err := s.holdRows(tctx, tx, marker, from, all, now); err != nil {
			return fmt.Errorf("hold the batches: %w", err)
		}
		held, err := s.readLayout(tctx, tx, marker, from)
		if err != nil {
			return fmt.Errorf("read the checkpoints: %w", err)
		}
		read := func(ctx context.Context, after, upTo int64, limit int) ([]domain.EventEnvelope[any], error) {
			events, err := readFeed(ctx, tx, s.stmt.feedRange, after, upTo, limit)
			if err != nil {
				return nil, fmt.Errorf("pgxstore: read the feed after position %d: %w", after, err)
			}
			return events, nil
		}
		target, apply, err := catchUp(ctx, held, read)
		if err != nil {
			return err
		}
		if apply != nil {
			htx := newHandlerTx(tx, s.pool)
			if err := errors.Join(apply(withTx(tctx, htx)), htx.misused()); err != nil {
				return err
			}
		}
		var retired []string
		for _, name := range from {
			if !slices.Contains(to, name) {
				retired = append(retired, name)
			}
		}
		for _, w := range []struct {
			names                 []string
			position, redelivered int64
		}{{to, target, held.LowestRedelivery()}, {retired, subscriptions.RetiredCheckpoint, 0}, {[]string{marker}, count, 0}} {
			if _, err := tx.Exec(tctx, s.stmt.writeRows, w.names, w.position, now, w.redelivered); err != nil {
				return fmt.Errorf("write the checkpoints: %w", err)
			}
		}
		return s.clearAttempts(tctx, tx, append(slices.Clone(from), to...)...)
	})
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			return fmt.Errorf("pgxstore: %s: %w: %w", what, ctxErr, err)
		}
		return fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	return nil
}

// readLayout reads, under the hold, the count's row and from's checkpoints
// and delivery marks, the name's catch-up mark under marker's pause key.
func (s *CheckpointStore) readLayout(ctx context.Context, tx pgx.Tx, marker string, from []string) (subscriptions.RepartitionRows, error) {
	rows, err := tx.Query(ctx, s.stmt.readLayout, append(slices.Clone(from), marker), subscriptions.PauseKey(marker))
	if err != nil {
		return subscriptions.RepartitionRows{}, err
	}
	type row struct{ position, redelivered, catchUp int64 }
	byName := map[string]row{}
	var name string
	var r row
	if _, err := pgx.ForEachRow(rows, []any{&name, &r.position, &r.redelivered, &r.catchUp}, func() error {
		byName[name] = r
		return nil
	}); err != nil {
		return subscriptions.RepartitionRows{}, err
	}
	held := subscriptions.RepartitionRows{Recorded: byName[marker].position, Positions: make([]int64, len(from)), Marks: make([]subscriptions.DeliveryMarks, len(from))}
	for i, n := range from {
		held.Positions[i] = byName[n].position
		held.Marks[i] = subscriptions.DeliveryMarks{RedeliveredThrough: byName[n].redelivered, CatchUpThrough: byName[n].catchUp}
	}
	return held, nil
}

// holdRows creates the count's row and the missing rows of from and locks
// the count's row, then every row of all in name order.
func (s *CheckpointStore) holdRows(ctx context.Context, tx pgx.Tx, marker string, from, all []string, now time.Time) error {
	if _, err := tx.Exec(ctx, s.stmt.createRows, []string{marker}, now); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.stmt.lockPosition, marker); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.stmt.createRows, slices.Sorted(slices.Values(from)), now); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, s.stmt.lockRows, all)
	return err
}
