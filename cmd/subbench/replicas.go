package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

// replicaResult is one catch-up by one or more replicas of a subscriber.
type replicaResult struct {
	elapsed        time.Duration
	dupCalls       int64   // handler calls beyond the first, per event
	dupCommitted   int64   // projection rows written more than once
	callsPerWorker []int64 // handler calls per replica
}

// runReplicas: scenario 5.
func runReplicas(ctx context.Context, b *bench) ([]Row, error) {
	sz := b.sizes()
	n := sz.replicaEvents
	dsn, setup, store, err := b.newPGStore(ctx, "replicas", 4)
	if err != nil {
		return nil, err
	}
	if err := fillStore(ctx, store, n, 1000); err != nil {
		return nil, err
	}
	if err := execAll(setup, `CREATE TABLE replica_projection (event_id text NOT NULL PRIMARY KEY, calls integer NOT NULL)`, "ANALYZE"); err != nil {
		return nil, err
	}
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := subscriptions.NewGormCheckpointStore(setup); err != nil {
		return nil, err
	}
	single, err := newReplicaSet(b, dsn, 1)
	if err != nil {
		return nil, err
	}
	multi, err := newReplicaSet(b, dsn, 4)
	if err != nil {
		return nil, err
	}
	var one, four replicaResult
	single.kinds.take()
	multi.kinds.take()
	sl := cutSlices(head, sz.replicaSlices)
	for k, r := range sl {
		order := []*replicaSet{single, multi}
		if k%2 == 1 {
			order = []*replicaSet{multi, single}
		}
		for _, set := range order {
			res, err := set.run(ctx, b, setup, r[0], r[1])
			if err != nil {
				return nil, fmt.Errorf("%d replica(s), slice (%d, %d]: %w", len(set.stores), r[0], r[1], err)
			}
			if set == single {
				one.add(res)
			} else {
				four.add(res)
			}
		}
	}
	multiRes, singleRes := four, one
	stmts := func(set *replicaSet) string {
		c := set.kinds.take()
		batches := float64(n) / 100
		var parts []string
		for _, k := range []string{"read checkpoint", "read feed", "BEGIN", "lock checkpoint", "create checkpoint", "handler upsert", "advance checkpoint", "COMMIT", "ROLLBACK", "other"} {
			if c[k] > 0 {
				parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(c[k])/batches))
			}
		}
		return strings.Join(parts, ", ")
	}
	stmtNote := fmt.Sprintf("statements per 100 events (one batch), all replicas together: 4 replicas: %s; one subscriber: %s", stmts(multi), stmts(single))
	calls := make([]string, len(multiRes.callsPerWorker))
	for i, c := range multiRes.callsPerWorker {
		calls[i] = fmt.Sprint(c)
	}
	note := fmt.Sprintf("%d events in %d slices, each caught up by one subscriber and by 4 replicas in turn; batch 100, poll interval 100 ms, one upsert per event through TxFromContext; handler calls per replica: %s",
		n, len(sl), strings.Join(calls, "/"))
	bname := "one subscriber on one pool, same events and handler"
	rows := []Row{newRow("4 replicas: total throughput", float64(n)/multiRes.elapsed.Seconds(), float64(n)/singleRes.elapsed.Seconds(), "ev/s", bname).note(note).note(stmtNote)}
	r := newRow("4 replicas: duplicate handler calls", float64(multiRes.dupCalls), float64(singleRes.dupCalls), "count", bname).goal("0", multiRes.dupCalls == 0)
	r.Duplicates = &multiRes.dupCalls
	rows = append(rows, r)
	r = newRow("4 replicas: duplicate committed writes", float64(multiRes.dupCommitted), float64(singleRes.dupCommitted), "count", bname).goal("0", multiRes.dupCommitted == 0)
	r.Duplicates = &multiRes.dupCommitted
	rows = append(rows, r)
	return rows, nil
}

func (r *replicaResult) add(o replicaResult) {
	r.elapsed += o.elapsed
	r.dupCalls += o.dupCalls
	r.dupCommitted += o.dupCommitted
	if r.callsPerWorker == nil {
		r.callsPerWorker = make([]int64, len(o.callsPerWorker))
	}
	for i, c := range o.callsPerWorker {
		r.callsPerWorker[i] += c
	}
}

// replicaSet is N replicas of one subscriber, each on a pool of its own
// (as N processes would be).
type replicaSet struct {
	name   string
	kinds  *kindCounter // statements of every replica's pool, by kind
	stores []domain.EventStore
	cps    []subscriptions.CheckpointStore
}

func newReplicaSet(b *bench, dsn string, replicas int) (*replicaSet, error) {
	set := &replicaSet{name: fmt.Sprintf("replicated-%d", replicas), kinds: &kindCounter{}}
	for range replicas {
		db, err := b.openPG(dsn, 4, set.kinds)
		if err != nil {
			return nil, err
		}
		store, err := infrastructure.NewGormEventStore(db)
		if err != nil {
			return nil, err
		}
		cps, err := subscriptions.NewGormCheckpointStore(db)
		if err != nil {
			return nil, err
		}
		set.stores = append(set.stores, store)
		set.cps = append(set.cps, cps)
	}
	return set, nil
}

// run resets the checkpoint to from and runs every replica until the
// checkpoint reaches head (the feed is capped there).
func (set *replicaSet) run(ctx context.Context, b *bench, setup *gorm.DB, from, head int64) (replicaResult, error) {
	var res replicaResult
	replicas := len(set.stores)
	name := set.name
	if err := setup.Exec("TRUNCATE replica_projection").Error; err != nil {
		return res, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(setup)
	if err != nil {
		return res, err
	}
	if err := cps.Reset(ctx, name, from); err != nil {
		return res, err
	}
	calls := make([]atomic.Int32, head+1)
	perWorker := make([]atomic.Int64, replicas)
	subs := make([]*subscriptions.Subscriber, replicas)
	for i := range replicas {
		handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
			calls[ev.Position].Add(1)
			perWorker[i].Add(1)
			tx := subscriptions.TxFromContext(ctx)
			if tx == nil {
				return errors.New("no batch transaction")
			}
			return tx.Exec(`INSERT INTO replica_projection (event_id, calls) VALUES (?, 1)
				ON CONFLICT (event_id) DO UPDATE SET calls = replica_projection.calls + 1`, ev.ID).Error
		}
		subs[i], err = subscriptions.NewSubscriber(name, &cappedStore{EventStore: set.stores[i], max: head}, set.cps[i], handler,
			subscriptions.WithBatchSize(100), subscriptions.WithPollInterval(100*time.Millisecond), subscriptions.WithLogger(b.libLogger()))
		if err != nil {
			return res, err
		}
	}
	res.elapsed, err = runSubscribersUntil(ctx, subs, time.Millisecond, func() (bool, error) {
		pos, err := cps.Position(ctx, name)
		return pos >= head, err
	})
	if err != nil {
		return res, err
	}
	var missing int64
	for p := from + 1; p <= head; p++ {
		switch c := int64(calls[p].Load()); {
		case c == 0:
			missing++
		case c > 1:
			res.dupCalls += c - 1
		}
	}
	if missing > 0 {
		return res, fmt.Errorf("%d events were never handled", missing)
	}
	for i := range perWorker {
		res.callsPerWorker = append(res.callsPerWorker, perWorker[i].Load())
	}
	var agg struct {
		Rows  int64
		Calls int64
	}
	if err := setup.Raw("SELECT COUNT(*) AS rows, COALESCE(SUM(calls), 0) AS calls FROM replica_projection").Scan(&agg).Error; err != nil {
		return res, err
	}
	if agg.Rows != head-from {
		return res, fmt.Errorf("the projection holds %d rows, want %d", agg.Rows, head-from)
	}
	res.dupCommitted = agg.Calls - agg.Rows
	return res, nil
}

// runSubscribersUntil runs every subscriber of subs on a goroutine of its
// own until done reports true (asked every interval), then stops them all
// and waits for them. It returns the time from the start to done's true,
// the stop not included, and the subscribers' errors joined with done's
// or ctx's. No goroutine outlives the call.
func runSubscribersUntil(ctx context.Context, subs []*subscriptions.Subscriber, every time.Duration, done func() (bool, error)) (time.Duration, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(subs))
	start := time.Now()
	for _, s := range subs {
		go func() { errc <- s.Run(rctx) }()
	}
	stopAll := func() error {
		cancel()
		var errs []error
		for range subs {
			errs = append(errs, <-errc)
		}
		return errors.Join(errs...)
	}
	for {
		ok, err := done()
		if err != nil {
			return 0, errors.Join(err, stopAll())
		}
		if ok {
			break
		}
		if !ctxsleep.Sleep(ctx, every) {
			return 0, errors.Join(ctx.Err(), stopAll())
		}
	}
	elapsed := time.Since(start)
	return elapsed, stopAll()
}
