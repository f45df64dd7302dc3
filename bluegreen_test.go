package subscriptions_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// bgAccounts is the number of accounts of the blue/green projection.
const bgAccounts = 100

// bgEvents is the history rebuilt: 50,000 events in the long form
// (SUBSCRIPTIONS_LONG=1, about a minute per backend on a loaded 2-core
// machine under -race), 1,500 in go test ./... (with bgBatch, three
// batches per version: every path, the readers and the appends through the
// rebuild and the switch included, runs in both forms).
func bgEvents() int { return faultScale(1_500, 50_000) }

// bgBatch is the versions' batch size: 1,000 in the long form, 500 in the
// short one, so that the short history is still three batches.
func bgBatch() int { return faultScale(500, 1_000) }

// bgBurst is the number of events of one account the writer appends at a
// time while the new version is built.
const bgBurst = 5

// bgRow is one account of a balances projection.
type bgRow struct {
	Account string
	Balance int64
	Events  int64
}

// bgHandler projects deposits into table through the batch transaction.
func bgHandler(e *env, table string) subscriptions.Handler {
	return func(ctx context.Context, ev coreEnvelope) error {
		payload, ok := ev.Payload.(map[string]any)
		if !ok {
			return fmt.Errorf("event %s: payload %T", ev.ID, ev.Payload)
		}
		amount, _ := payload["amount"].(float64)
		return e.Exec(ctx, `INSERT INTO `+table+` (account, balance, events) VALUES (?, ?, 1)
			ON CONFLICT (account) DO UPDATE SET balance = `+table+`.balance + excluded.balance, events = `+table+`.events + 1`,
			ev.AggregateID, int64(amount))
	}
}

// bgDeposit is one deposit event for account i.
func bgDeposit(i, amount int) domain.EventEnvelope[any] {
	return domain.NewEventEnvelope[any](map[string]any{"amount": amount}, fmt.Sprintf("acct-%03d", i%bgAccounts), "bg.deposited", 0)
}

// bgScratch is the projection computed from scratch from the whole feed.
func bgScratch(t *testing.T, store domain.EventStore) map[string]bgRow {
	t.Helper()
	events, err := store.ReadAfter(context.Background(), 0, 0)
	require.NoError(t, err)
	out := map[string]bgRow{}
	for _, ev := range events {
		amount := ev.Payload.(map[string]any)["amount"].(float64)
		r := out[ev.AggregateID]
		r.Account = ev.AggregateID
		r.Balance += int64(amount)
		r.Events++
		out[ev.AggregateID] = r
	}
	return out
}

func bgRead(t *testing.T, db *gorm.DB, relation string) map[string]bgRow {
	t.Helper()
	var rows []bgRow
	require.NoError(t, db.Raw("SELECT account, balance, events FROM "+relation).Scan(&rows).Error)
	out := make(map[string]bgRow, len(rows))
	for _, r := range rows {
		out[r.Account] = r
	}
	return out
}

// TestBlueGreenRebuild runs docs/rebuilds.md's blue/green procedure as
// written over bgEvents events (1,500; 50,000 with SUBSCRIPTIONS_LONG=1)
// while readers query the live view and appends continue: the new version
// replays under its own name, catches up (WaitCaughtUp), takes over
// (SwitchOver: the old one paused, the new one past its checkpoint, the
// view swapped in one transaction), and the old name is retired
// (DeleteState). No reader ever sees a partial table, nor an account with
// fewer events than an earlier read of its own saw (the switch must not go
// back in time); afterwards the new table equals a projection computed
// from scratch. Unpartitioned, and with both versions partitioned (by
// different counts). On SQLite (file) and Postgres (GORM and pgx): the
// memory backend has no tables to switch, and in-memory SQLite's one
// connection leaves readers no room beside the batches.
func TestBlueGreenRebuild(t *testing.T) {
	t.Parallel()
	for _, eb := range dbEnvs() {
		if eb.Name == "sqlite-memory" {
			continue // one connection: readers could not read alongside the batches
		}
		for _, parts := range [][2]int{{0, 0}, {4, 2}} {
			name := eb.Name
			if parts[0] > 0 {
				name += fmt.Sprintf("/partitions-%d-then-%d", parts[0], parts[1])
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bgRun(t, eb.New(t), parts[0], parts[1])
			})
		}
	}
}

// bgOptions are a version's options: its batch size, the parking lot, and
// n partitions with two workers (none for 0).
func bgOptions(e *env, n int) []subscriptions.SubscriberOption {
	opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(bgBatch()), subscriptions.WithParkingLot(e.Parking)}
	if n > 0 {
		opts = append(opts, subscriptions.WithPartitions(n), subscriptions.WithConcurrency(2))
	}
	return opts
}

func bgRun(t *testing.T, e *env, v1Parts, v2Parts int) {
	ctx := context.Background()
	if v1Parts > 0 {
	}
	readDB := e.DB
	if e.Postgres() {
		readDB = e.PG.Open(t) // the readers are another process
	}
	for _, table := range []string{"bg_v1", "bg_v2"} {
		require.NoError(t, e.DB.Exec("CREATE TABLE "+table+" (account text PRIMARY KEY, balance bigint NOT NULL, events bigint NOT NULL)").Error)
	}
	view := func(table string) string {
		return "CREATE VIEW bg_live AS SELECT account, balance, events FROM " + table
	}
	require.NoError(t, e.DB.Exec(view("bg_v1")).Error)

	// History: bgEvents() deposits over 100 accounts, one append each.
	perAppend := bgEvents() / bgAccounts
	for i := 0; i < bgEvents(); i += perAppend {
		batch := make([]domain.EventEnvelope[any], perAppend)
		for j := range batch {
			batch[j] = bgDeposit(i/perAppend, 1+(i+j)%7)
		}
		require.NoError(t, e.Events.Append(ctx, batch[0].AggregateID, -1, batch...))
	}

	// Version 1 is live.
	v1 := coreNewSub(t, "bg/v1", e.Events, e.Checkpoints, bgHandler(e, "bg_v1"), bgOptions(e, v1Parts)...)
	runV1 := start(t, v1)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	_, err := v1.WaitCaughtUp(wctx)
	require.NoError(t, err)

	// Readers query the live view throughout; each remembers what it saw
	// of every account.
	var reads, readsAfterSwitch, partial, backwards atomic.Int64
	var switched atomic.Bool
	var firstBad, firstBack atomic.Value
	readCtx, stopReaders := context.WithCancel(ctx)
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			seen := map[string]int64{}
			for readCtx.Err() == nil {
				after := switched.Load()
				var rows []bgRow
				err := readDB.WithContext(readCtx).Raw("SELECT account, balance, events FROM bg_live").Scan(&rows).Error
				if readCtx.Err() != nil {
					return
				}
				var events int64
				for _, r := range rows {
					events += r.Events
					if r.Events < seen[r.Account] {
						backwards.Add(1)
						firstBack.CompareAndSwap(nil, fmt.Sprintf("account %s: %d events after %d", r.Account, r.Events, seen[r.Account]))
					}
					seen[r.Account] = r.Events
				}
				if err != nil || len(rows) != bgAccounts || events < int64(bgEvents()) {
					partial.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("accounts %d, events %d, error %v", len(rows), events, err))
					continue
				}
				reads.Add(1)
				if after {
					readsAfterSwitch.Add(1)
				}
				select { // a short pause: readers must not starve the rebuild of the 2 cores
				case <-readCtx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			}
		})
	}
	defer func() { stopReaders(); readers.Wait() }()

	// Appends continue through the rebuild and the switch, in bursts of
	// bgBurst events of one account: enough that the new version trails the
	// old one when it has caught up with the head it started from, as it
	// does in production by everything appended during the replay.
	var appended atomic.Int64
	var appendErr atomic.Value
	writeCtx, stopWriter := context.WithCancel(ctx)
	var writer sync.WaitGroup
	writer.Go(func() {
		for i := 0; writeCtx.Err() == nil && i < 20_000; i++ {
			burst := make([]domain.EventEnvelope[any], bgBurst)
			for j := range burst {
				burst[j] = bgDeposit(i, 3)
			}
			if err := e.Events.Append(context.WithoutCancel(writeCtx), burst[0].AggregateID, -1, burst...); err != nil {
				appendErr.CompareAndSwap(nil, err.Error())
				return
			}
			appended.Add(bgBurst)
			select {
			case <-writeCtx.Done():
			case <-time.After(2 * time.Millisecond):
			}
		}
	})
	defer func() { stopWriter(); writer.Wait() }()

	// Version 2 replays everything into its own table and catches up.
	v2 := coreNewSub(t, "bg/v2", e.Events, e.Checkpoints, bgHandler(e, "bg_v2"), bgOptions(e, v2Parts)...)
	runV2 := start(t, v2)
	head, err := v2.WaitCaughtUp(wctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, head, int64(bgEvents()))
	require.Eventually(t, func() bool { return reads.Load() > 0 }, time.Minute, time.Millisecond)

	// It takes over: v1 paused, v2 past v1's checkpoint, the view swapped
	// in one transaction.
	require.NoError(t, v2.SwitchOver(wctx, v1, func(ctx context.Context) error {
		err := e.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("DROP VIEW bg_live").Error; err != nil {
				return err
			}
			return tx.Exec(view("bg_v2")).Error
		})
		if err == nil {
			switched.Store(true)
		}
		return err
	}))
	st, err := v1.Status(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused, "the old version stays paused")
	atSwitch := appended.Load()
	require.Eventually(t, func() bool { return appended.Load() >= atSwitch+20*bgBurst && readsAfterSwitch.Load() > 0 },
		time.Minute, time.Millisecond, "appends and reads continue after the switch")
	stopWriter()
	writer.Wait()
	require.Nil(t, appendErr.Load())

	// Retire version 1.
	v1Rows := bgRead(t, e.DB, "bg_v1")
	runV1.stop(t)
	require.Equal(t, v1Rows, bgRead(t, e.DB, "bg_v1"), "the paused version handled nothing more")
	require.NoError(t, v1.DeleteState(ctx))
	require.Zero(t, faultCheckpoint(t, e.DB, "bg/v1"))
	st, err = v1.Status(ctx)
	require.NoError(t, err)
	require.False(t, st.Paused, "DeleteState lifts the pause with the rest of the state")
	require.NoError(t, e.DB.Exec("DROP TABLE bg_v1").Error)

	_, err = v2.WaitCaughtUp(wctx)
	require.NoError(t, err)
	stopReaders()
	readers.Wait()
	runV2.stop(t)

	require.Zero(t, partial.Load(), "a reader saw a partial table: %v", firstBad.Load())
	require.Zero(t, backwards.Load(), "a reader saw an account go back: %v", firstBack.Load())
	scratch := bgScratch(t, e.Events)
	require.Len(t, scratch, bgAccounts)
	require.Equal(t, scratch, bgRead(t, e.DB, "bg_v2"), "the new table equals a from-scratch projection")
	require.Equal(t, scratch, bgRead(t, e.DB, "bg_live"))
	t.Logf("%d events at the rebuild's start, %d appended during it; %d reads, %d after the switch, 0 partial, 0 backwards",
		bgEvents(), appended.Load(), reads.Load(), readsAfterSwitch.Load())
}
