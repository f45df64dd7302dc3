package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

const (
	// liveView is what readers query; it selects from one version's table.
	liveView = "balances_live"
	// v2Name and v2Table are the new version of the projection.
	v2Name  = "balances/v2"
	v2Table = "balances_v2"
)

// viewDDL (re)creates the readers' view over one version's table.
func viewDDL(table string) string {
	return "CREATE VIEW " + liveView + " AS SELECT account_id, owner, balance, events FROM " + table
}

// blueGreen rebuilds the projection without readers ever seeing a partial
// table or one going back (docs/rebuilds.md): the old version
// ("balances", run again here by old) keeps serving the view while the new
// version ("balances/v2") replays the whole feed into its own table; once
// it has caught up, SwitchOver pauses the old version, waits until the new
// one has passed it and runs the view's switch, one transaction; then the
// old name is stopped and retired (its checkpoint and parked events
// deleted, its table dropped). Events are appended throughout, including
// right after the switch: the new version's subscriber, which keeps
// running, handles them.
func (ex *example) blueGreen(ctx context.Context, old *subscriptions.Subscriber) error {
	out := ex.stdout
	r := ex.be.replicas[0]
	db := r.db.WithContext(ctx)
	if err := db.Exec(balancesDDL(v2Table)).Error; err != nil {
		return fmt.Errorf("create %s: %w", v2Table, err)
	}
	fmt.Fprintf(out, "blue/green rebuild: %q replays the feed into %s while %q keeps serving %s\n", v2Name, v2Table, subscriberName, liveView)

	var wg sync.WaitGroup
	defer wg.Wait()
	oldCtx, stopOld := context.WithCancel(ctx)
	defer stopOld()
	newCtx, stopNew := context.WithCancel(ctx)
	defer stopNew()
	readCtx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()

	// The old version runs again (a Subscriber can be run again once its
	// Run has returned), so that it keeps its table current meanwhile.
	oldDone := make(chan error, 1)
	wg.Go(func() { oldDone <- old.Run(oldCtx) })

	v2, err := subscriptions.NewSubscriber(v2Name, r.events, r.checkpoints, ex.projection(v2Table).Dispatch,
		subscriptions.WithBatchSize(100),
		subscriptions.WithPollInterval(20*time.Millisecond),
		subscriptions.WithParkingLot(r.parking),
		subscriptions.WithLogger(ex.log))
	if err != nil {
		return err
	}
	newDone := make(chan error, 1)
	wg.Go(func() { newDone <- v2.Run(newCtx) })

	// A reader queries the view all along: it must always see all three
	// accounts and at least the events projected before the rebuild.
	var reads, partial atomic.Int64
	var readErr error
	firstRead := make(chan struct{})
	wg.Go(func() {
		defer func() {
			if reads.Load() == 0 {
				close(firstRead)
			}
		}()
		for readCtx.Err() == nil {
			var row struct{ Accounts, Events int64 }
			err := r.db.WithContext(readCtx).Raw("SELECT count(*) AS accounts, coalesce(sum(events), 0) AS events FROM " + liveView).Scan(&row).Error
			if err != nil {
				if readCtx.Err() == nil {
					readErr = err
				}
				return
			}
			if reads.Add(1) == 1 {
				close(firstRead)
			}
			if row.Accounts != 3 || row.Events < int64(len(script)) {
				partial.Add(1)
			}
		}
	})

	// Events keep arriving during the rebuild.
	for _, amount := range []int64{10, 20} {
		if _, err := ex.append(ctx, "acc-3", typeDeposited, MoneyDeposited{Amount: amount}); err != nil {
			return err
		}
	}
	head, err := v2.WaitCaughtUp(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%q caught up to position %d (WaitCaughtUp)\n", v2Name, head)

	// The switch: the old version paused everywhere, the new one past its
	// checkpoint, then one transaction of the application's own. Readers
	// see the old table or the new one, never neither, and never less of
	// it than before.
	if err := v2.SwitchOver(ctx, old, func(ctx context.Context) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("DROP VIEW " + liveView).Error; err != nil {
				return err
			}
			return tx.Exec(viewDDL(v2Table)).Error
		})
	}); err != nil {
		return fmt.Errorf("switch %s to %s: %w", liveView, v2Table, err)
	}
	fmt.Fprintf(out, "switched: %s now reads %s (SwitchOver: %q paused, %q past it, one transaction)\n", liveView, v2Table, subscriberName, v2Name)
	if _, err := ex.append(ctx, "acc-1", typeDeposited, MoneyDeposited{Amount: 5}); err != nil {
		return err
	}

	// Retire the old version: stop it (every replica, in every process),
	// delete its checkpoint and parked events, drop its table.
	stopOld()
	if err := <-oldDone; err != nil {
		return err
	}
	if err := old.DeleteState(ctx); err != nil {
		return err
	}
	if err := db.Exec("DROP TABLE balances").Error; err != nil {
		return fmt.Errorf("drop the old table: %w", err)
	}
	fmt.Fprintf(out, "retired %q: stopped, checkpoint and parked events deleted (DeleteState), table dropped\n", subscriberName)

	if _, err := v2.WaitCaughtUp(ctx); err != nil {
		return err
	}
	<-firstRead // at least one read, however loaded the machine
	stopReaders()
	stopNew()
	if err := <-newDone; err != nil {
		return err
	}
	wg.Wait()
	if readErr != nil {
		return fmt.Errorf("reader: %w", readErr)
	}
	if err := ex.printBalances(ctx, "balances (after the blue/green rebuild, 3 more events)"); err != nil {
		return err
	}
	fmt.Fprintf(out, "readers: %d reads of %s during the rebuild and the switch, %d saw a partial table\n", reads.Load(), liveView, partial.Load())
	if partial.Load() != 0 {
		return errors.New("a reader saw a partial projection")
	}
	return nil
}

// projection is the new version's handler: the same projection, fixed
// (overdrafts allowed), written into table.
func (ex *example) projection(table string) *domain.EventDispatcher {
	d := domain.NewEventDispatcher()
	must := func(err error) {
		if err != nil {
			panic(err) // only for empty patterns or nil handlers: a programming error
		}
	}
	must(domain.Subscribe(d, typeOpened, func(ctx context.Context, e domain.EventEnvelope[AccountOpened]) error {
		return upsertBalanceIn(ctx, table, e.AggregateID, e.Payload.Owner, 0)
	}))
	must(domain.Subscribe(d, typeDeposited, func(ctx context.Context, e domain.EventEnvelope[MoneyDeposited]) error {
		return upsertBalanceIn(ctx, table, e.AggregateID, "", e.Payload.Amount)
	}))
	must(domain.Subscribe(d, typeWithdrawn, func(ctx context.Context, e domain.EventEnvelope[MoneyWithdrawn]) error {
		return upsertBalanceIn(ctx, table, e.AggregateID, "", -e.Payload.Amount)
	}))
	return d
}
