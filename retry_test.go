package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// parkBackoff is the documented retry delay before retry n (n >= 1):
// initial doubled per retry, capped at maximum.
func parkBackoff(initial, maximum time.Duration, n int) time.Duration {
	d := initial
	for i := 1; i < n; i++ {
		d *= 2
		if d >= maximum {
			return maximum
		}
	}
	return min(d, maximum)
}

// parkRequireBackoffGaps checks that consecutive attempts are at least
// the configured backoff apart (lower bounds only: a loaded machine may
// be slower, never faster).
func parkRequireBackoffGaps(t *testing.T, attempts []time.Time, initial, maximum time.Duration) {
	t.Helper()
	for n := 1; n < len(attempts); n++ {
		gap := attempts[n].Sub(attempts[n-1])
		want := parkBackoff(initial, maximum, n)
		require.GreaterOrEqual(t, gap, want, "gap before retry %d is %v, want at least %v (all attempts: %v)", n, gap, want, attempts)
	}
}

// parkPoisonRun runs a subscriber over 3 events, a poison event (whose
// handler always fails after writing through the batch transaction) and 3
// more events, until the poison event is parked and the subscriber caught
// up. It returns the poison event's attempt times and its parked entry.
func parkPoisonRun(t *testing.T, e *env, name string, batchSize, maxRetries int, initial, maximum time.Duration) (domain.EventEnvelope[any], []time.Time, subscriptions.ParkedEvent) {
	t.Helper()
	before, poison, after := parkFeed(t, e, 3, 3)
	probe := newParkProbe()
	h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
		if ev.ID == poison.ID {
			return errParkPoison
		}
		return nil
	})
	sub := parkSubscriber(t, e, name, h,
		subscriptions.WithBatchSize(batchSize),
		subscriptions.WithParkingLot(e.Parking),
		subscriptions.WithMaxRetries(maxRetries),
		subscriptions.WithRetryBackoff(initial, maximum))

	startedAt := time.Now()
	r := start(t, sub)
	parked := parkWaitParked(t, sub, 1)
	waitCaughtUp(t, sub)
	r.stop(t)

	attempts := probe.attemptsOf(poison.ID)
	require.GreaterOrEqual(t, len(attempts), 1+maxRetries)
	p := parked[0]
	require.Equal(t, name, p.Subscriber)
	require.Equal(t, poison.ID, p.EventID)
	require.Equal(t, poison.EventType, p.EventType)
	require.Equal(t, poison.Position, p.Position)
	require.Equal(t, 1+maxRetries, p.Attempts)
	require.Contains(t, p.Error, errParkPoison.Error())
	require.WithinRange(t, p.ParkedAt, startedAt.Add(-time.Second), time.Now().Add(time.Second))
	require.False(t, p.ParkedAt.Before(attempts[0].Add(-time.Second)), "parked_at %v is before the first attempt %v", p.ParkedAt, attempts[0])

	head, err := e.Events.HeadPosition(context.Background())
	require.NoError(t, err)
	require.Equal(t, head, parkPosition(t, e, name), "the checkpoint moves past the poison event")
	// Events before and after the poison one commit (once each, on the
	// database backends); none of the poison event's writes does.
	parkRequireProcessed(t, e, probe, parkConcat(before, after))
	for _, id := range after {
		require.Positive(t, probe.count(id), "event %s behind the poison event was never handled", id)
	}
	return poison, attempts, p
}

var errParkPoison = errors.New("park: poison event refused")

// TestRetryPoisonEventIsParkedAfterBackoff: a handler that always fails on
// one event. The event is retried with doubling, capped backoff, then
// parked with its error, attempt count, position and time; the checkpoint
// moves past it, the events behind it are processed, and only the failed
// attempts' writes through the batch transaction are discarded — the other
// events of its batch, before and after it, commit.
func TestRetryPoisonEventIsParkedAfterBackoff(t *testing.T) {
	t.Parallel()
	const maxRetries = 5
	initial, maximum := 2*time.Millisecond, 8*time.Millisecond // 2, 4, 8, 8, 8
	cases := []struct {
		name      string
		batchSize int
	}{
		// The three events before fill the first batch: the poison event
		// heads the second, with the three events after it.
		{"head of batch", 3},
		// One batch holds all seven events.
		{"middle of batch", 100},
	}
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					e := b.New(t)
					_, attempts, _ := parkPoisonRun(t, e, "park-poison", tc.batchSize, maxRetries, initial, maximum)
					// The last 1+maxRetries attempts are the retry sequence: the
					// first attempt, then maxRetries retries after growing delays.
					// (In the middle of a batch one more attempt precedes them:
					// see TestRetryMiddleOfBatchAttemptCount.)
					seq := attempts[len(attempts)-1-maxRetries:]
					parkRequireBackoffGaps(t, seq, initial, maximum)
					if tc.batchSize == 3 {
						require.Len(t, attempts, 1+maxRetries, "the poison event is attempted once and retried maxRetries times")
					}
				})
			}
		})
	}
}

// TestRetryMiddleOfBatchAttemptCount: a poison event that is not the first
// of its batch must also be attempted exactly 1+maxRetries times (and the
// parked attempt count must say how often the handler really ran).
func TestRetryMiddleOfBatchAttemptCount(t *testing.T) {
	t.Parallel()
	const maxRetries = 2
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			_, attempts, parked := parkPoisonRun(t, e, "park-poison-mid", 100, maxRetries, time.Millisecond, 4*time.Millisecond)
			require.Len(t, attempts, 1+maxRetries, "attempted %d times with WithMaxRetries(%d)", len(attempts), maxRetries)
			require.Equal(t, len(attempts), parked.Attempts, "parked attempt count vs real handler runs")
			parkRequireBackoffGaps(t, attempts, time.Millisecond, 4*time.Millisecond)
		})
	}
}

// TestRetryTransientFailureIsNotParked: a handler that fails a few times
// and then succeeds (on an intermediate retry, or on the last one, which
// runs under a savepoint) is not parked, and its writes commit exactly
// once.
func TestRetryTransientFailureIsNotParked(t *testing.T) {
	t.Parallel()
	const maxRetries = 3
	cases := []struct {
		name      string
		succeedOn int // attempt number that succeeds
	}{
		{"succeeds on the first retry", 2},
		{"succeeds on the last retry", 1 + maxRetries},
	}
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					e := b.New(t)
					before, poison, after := parkFeed(t, e, 2, 2)
					probe := newParkProbe()
					h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], n int) error {
						if ev.ID == poison.ID && n < tc.succeedOn {
							return fmt.Errorf("park: transient failure %d", n)
						}
						return nil
					})
					// Batches of two: the poison event heads the second batch, so
					// its attempts are numbered from the start of its retries.
					sub := parkSubscriber(t, e, "park-transient", h,
						subscriptions.WithBatchSize(2),
						subscriptions.WithParkingLot(e.Parking),
						subscriptions.WithMaxRetries(maxRetries))
					r := start(t, sub)
					waitCaughtUp(t, sub)
					r.stop(t)

					parked, err := sub.ListParked(context.Background())
					require.NoError(t, err)
					require.Empty(t, parked, "a transient failure must not be parked")
					require.NotNil(t, parked)
					require.Equal(t, tc.succeedOn, probe.count(poison.ID))
					require.Equal(t, 1, probe.handledCount(poison.ID), "the event succeeded exactly once")
					parkRequireProcessed(t, e, probe, parkConcat(before, []string{poison.ID}, after))
				})
			}
		})
	}
}

// TestRetryWithoutParkingLotHalts: without a parking lot a failing event
// halts the checkpoint, is retried every poll interval, and each failure
// is logged at error level with the subscriber, position, event ID and
// type.
func TestRetryWithoutParkingLotHalts(t *testing.T) {
	t.Parallel()
	const poll = 20 * time.Millisecond
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			before, poison, after := parkFeed(t, e, 1, 2)
			probe := newParkProbe()
			h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
				if ev.ID == poison.ID {
					return errors.New("park: poison refused")
				}
				return nil
			})
			logger, logs := newLogger()
			sub := parkSubscriber(t, e, "park-halt", h,
				subscriptions.WithLogger(logger),
				subscriptions.WithPollInterval(poll),
				subscriptions.WithMaxRetries(1)) // meaningless without a lot
			r := start(t, sub)
			require.Eventually(t, func() bool { return probe.count(poison.ID) >= 5 }, 30*time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool { return parkPosition(t, e, "park-halt") == poison.Position-1 }, 30*time.Second, 5*time.Millisecond)
			r.stop(t)

			require.Equal(t, poison.Position-1, parkPosition(t, e, "park-halt"), "the checkpoint halts before the failing event")
			for _, id := range after {
				require.Zero(t, probe.count(id), "an event behind the failing one was handled")
			}
			parkRequireProcessed(t, e, probe, before)

			// The retries of the failing event, as the head of its own batch,
			// are one poll interval apart at least. (The first attempt ran in
			// the batch that also held the event before it.)
			attempts := probe.attemptsOf(poison.ID)
			for i := 2; i < len(attempts); i++ {
				require.GreaterOrEqual(t, attempts[i].Sub(attempts[i-1]), poll, "retry %d came sooner than the poll interval", i)
			}

			var found bool
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "level=ERROR") && strings.Contains(line, "event_id="+poison.ID) {
					require.Contains(t, line, "subscriber=park-halt")
					require.Contains(t, line, fmt.Sprintf("position=%d", poison.Position))
					require.Contains(t, line, "event_type=park.poison")
					require.Contains(t, line, "park: poison refused")
					found = true
				}
			}
			require.True(t, found, "no error-level log line names the failing event; logs:\n%s", logs.String())
		})
	}
}

// TestRetryShutdownDuringBackoff cancels Run while it waits out a long
// retry backoff: Run returns nil promptly, no transaction is held during
// the wait, the failed attempt's writes are rolled back, and the event is
// redelivered on restart.
func TestRetryShutdownDuringBackoff(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			_, poison, after := parkFeed(t, e, 0, 2)
			var failing atomic.Bool
			failing.Store(true)
			attempted := make(chan struct{}, 16)
			probe := newParkProbe()
			h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
				if ev.ID == poison.ID && failing.Load() {
					attempted <- struct{}{}
					return errors.New("park: poison refused")
				}
				return nil
			})
			sub := parkSubscriber(t, e, "park-shutdown", h,
				subscriptions.WithParkingLot(e.Parking),
				subscriptions.WithMaxRetries(3),
				subscriptions.WithRetryBackoff(time.Minute, time.Minute))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			select {
			case <-attempted:
			case <-time.After(30 * time.Second):
				t.Fatal("the poison event was never attempted")
			}
			// While Run waits out the backoff, nothing holds the checkpoint:
			// another batch can be acquired at once.
			require.Eventually(t, func() bool {
				actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer acancel()
				batch, ok, err := e.Checkpoints.Acquire(actx, "park-shutdown")
				if err != nil || !ok {
					return false
				}
				require.Equal(t, poison.Position-1, batch.Position())
				require.NoError(t, batch.Rollback())
				return true
			}, 30*time.Second, 5*time.Millisecond, "the checkpoint stays held during the retry backoff")

			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s of cancellation during a 1 minute backoff")
			}
			require.Equal(t, 1, probe.count(poison.ID), "no retry ran before the backoff ended")
			require.Equal(t, poison.Position-1, parkPosition(t, e, "park-shutdown"), "the event was not committed")
			parked, err := e.Parking.List(context.Background(), "park-shutdown")
			require.NoError(t, err)
			require.Empty(t, parked, "the event was not parked")
			if e.DB != nil {
				require.Empty(t, projected(t, e.DB, parkProjection), "the failed attempt's write was rolled back")
			}

			// Restart with a handler that now succeeds: the event is
			// redelivered.
			failing.Store(false)
			sub2 := parkSubscriber(t, e, "park-shutdown", h, subscriptions.WithParkingLot(e.Parking))
			r := start(t, sub2)
			waitCaughtUp(t, sub2)
			r.stop(t)
			require.Equal(t, 2, probe.count(poison.ID), "redelivered on restart")
			parkRequireProcessed(t, e, probe, parkConcat([]string{poison.ID}, after))
		})
	}
}

// parkTimedStore wraps a CheckpointStore and records how long each batch's
// transaction stays open, from Acquire to Commit or Rollback.
// parkTimedStore records when each batch it hands out was open, from
// Acquire to the end of its Commit or Rollback, on the test process's
// monotonic clock.
type parkTimedStore struct {
	subscriptions.CheckpointStore
	mu      sync.Mutex
	batches []openSpan
}

// openSpan is a time a transaction was open: from from until to.
type openSpan struct{ from, to time.Time }

// covers reports whether s was open throughout [from, to].
func (s openSpan) covers(from, to time.Time) bool { return !s.from.After(from) && !s.to.Before(to) }

func (s *parkTimedStore) Acquire(ctx context.Context, subscriber string) (subscriptions.Batch, bool, error) {
	begun := time.Now()
	b, ok, err := s.CheckpointStore.Acquire(ctx, subscriber)
	if err != nil || !ok {
		return b, ok, err
	}
	return &parkTimedBatch{Batch: b, store: s, begun: begun}, true, nil
}

func (s *parkTimedStore) record(span openSpan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, span)
}

func (s *parkTimedStore) spans() []openSpan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]openSpan(nil), s.batches...)
}

type parkTimedBatch struct {
	subscriptions.Batch
	store *parkTimedStore
	begun time.Time
}

func (b *parkTimedBatch) Commit(ctx context.Context, position int64) error {
	defer func() { b.store.record(openSpan{b.begun, time.Now()}) }()
	return b.Batch.Commit(ctx, position)
}

func (b *parkTimedBatch) Rollback() error {
	defer func() { b.store.record(openSpan{b.begun, time.Now()}) }()
	return b.Batch.Rollback()
}

// serverTx is one transaction block of the test's pool as
// pg_stat_activity showed it: its backend, when it began (server clock)
// and when it was last seen open (server clock, at the sample).
type serverTx struct {
	PID       int64     `gorm:"column:pid"`
	XactStart time.Time `gorm:"column:xact_start"`
	SeenAt    time.Time `gorm:"column:seen_at"`
}

// TestRetryTransactionStaysShort: on Postgres with the default retry
// settings (5 retries from 100 ms, doubling: 3.1 s of backoff), no
// transaction is open across a retry's backoff. Each retry runs in a short
// transaction of its own, so no transaction, neither a batch seen by the
// checkpoint store nor any transaction block of the subscriber's pool
// seen by the server, was open from one attempt's handler call until the
// next's. The assertion is about order, not duration: a loaded machine
// stretches transactions, but cannot make one span a backoff the code
// waits outside any transaction. The durations are logged.
func TestRetryTransactionStaysShort(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	app := fmt.Sprintf("park_txlen_%d", time.Now().UnixNano())
	db := dbtest.OpenPostgresDSN(t, pg.DSN+"&application_name="+app)
	e := gormEnv(t, "postgres", db, pg)
	// The poison event heads the feed, so every setting can stay default
	// (see TestRetryMiddleOfBatchAttemptCount for a poison event mid-batch).
	before, poison, after := parkFeed(t, e, 0, 2)

	probe := newParkProbe()
	h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
		if ev.ID == poison.ID {
			return errors.New("park: poison refused")
		}
		return nil
	})
	timed := &parkTimedStore{CheckpointStore: e.Checkpoints}
	sub, err := subscriptions.NewSubscriber("park-txlen", e.Events, timed, h,
		subscriptions.WithLogger(quietLogger()),
		subscriptions.WithParkingLot(e.Parking)) // default retries and backoff
	require.NoError(t, err)

	// Sample the server's view too: every transaction block of this test's
	// pool (identified by its application_name). A statement outside one
	// (state active, begun with its transaction) is left out: it cannot be
	// held open across a sleep, only slowed by the machine.
	// seen is the sampler's until it has stopped (sampled is closed).
	seen := map[[2]int64]serverTx{}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			var rows []serverTx
			err := pg.DB.Raw(`SELECT pid, xact_start, clock_timestamp() AS seen_at FROM pg_stat_activity
				WHERE application_name = ? AND xact_start IS NOT NULL AND (state <> 'active' OR query_start > xact_start)`, app).Scan(&rows).Error
			if err != nil {
				continue // a sample missed; the next one is 5 ms away
			}
			for _, r := range rows {
				key := [2]int64{r.PID, r.XactStart.UnixMicro()}
				if prev, ok := seen[key]; !ok || r.SeenAt.After(prev.SeenAt) {
					seen[key] = r
				}
			}
		}
	}()
	defer func() {
		select {
		case <-stopSampling:
		default:
			close(stopSampling)
		}
		<-sampled
	}()

	r := start(t, sub)
	parked := parkWaitParked(t, sub, 1)
	waitCaughtUp(t, sub)
	r.stop(t)
	close(stopSampling)
	<-sampled

	attempts := probe.attemptsOf(poison.ID)
	require.Len(t, attempts, 1+subscriptions.DefaultMaxRetries)
	parkRequireBackoffGaps(t, attempts, subscriptions.DefaultRetryBackoff, subscriptions.DefaultMaxRetryBackoff)
	var backoffSum time.Duration
	for n := 1; n <= subscriptions.DefaultMaxRetries; n++ {
		backoffSum += parkBackoff(subscriptions.DefaultRetryBackoff, subscriptions.DefaultMaxRetryBackoff, n)
	}
	retrying := attempts[len(attempts)-1].Sub(attempts[0])
	toPark := parked[0].ParkedAt.Sub(attempts[0])
	batches := timed.spans()
	var longest, server time.Duration
	for _, b := range batches {
		longest = max(longest, b.to.Sub(b.from))
	}
	for _, tx := range seen {
		server = max(server, tx.SeenAt.Sub(tx.XactStart))
	}
	t.Logf("default retry settings: backoff sum %v; first to last attempt %v; first attempt to parked_at %v", backoffSum, retrying, toPark)
	t.Logf("longest batch transaction (Acquire to Commit/Rollback, %d batches): %v; longest transaction block sampled in pg_stat_activity (%d seen): %v", len(batches), longest, len(seen), server)

	require.GreaterOrEqual(t, retrying, backoffSum, "the retries waited out the default backoff")
	require.NotEmpty(t, seen, "the sampler saw the batch transactions")
	// The attempts' times are the test process's wall and monotonic clock;
	// the server's are the same machine's wall clock.
	for i := 1; i < len(attempts); i++ {
		prev, next := attempts[i-1], attempts[i]
		for _, b := range batches {
			require.False(t, b.covers(prev, next), "a batch transaction (open %v) stayed open across the backoff before attempt %d", b.to.Sub(b.from), i+1)
		}
		for _, tx := range seen {
			require.False(t, openSpan{tx.XactStart, tx.SeenAt}.covers(prev, next),
				"pg_stat_activity saw a transaction (backend %d, open %v) across the backoff before attempt %d", tx.PID, tx.SeenAt.Sub(tx.XactStart), i+1)
		}
	}
	parkRequireProcessed(t, e, probe, parkConcat(before, after))
}

// retryAttempts reads the subscriber's attempt count kept by the store.
func retryAttempts(t *testing.T, e *env, name string) int {
	t.Helper()
	store := e.Checkpoints
	if e.Pgx != nil {
		// pgxstore keeps its records in the GORM backend's table: read
		// them through a GORM store on the same schema.
		var err error
		store, err = subscriptions.NewGormCheckpointStore(e.DB)
		require.NoError(t, err)
	}
	n, err := subscriptions.AttemptsForTest(context.Background(), store, name)
	require.NoError(t, err)
	return n
}

// retryWaitRetrying waits until the subscriber reports the event as
// retrying with attempts made so far, and the store has counted them.
func retryWaitRetrying(t *testing.T, e *env, sub *subscriptions.Subscriber, id string, attempts int) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := sub.Status(context.Background())
		return err == nil && st.Failing != nil && st.Failing.ID == id && st.Attempts == attempts &&
			retryAttempts(t, e, sub.Name()) == attempts
	}, 30*time.Second, 5*time.Millisecond)
}

// retryPoisonFeed creates the projection (on a database) and appends
// nBefore events, a poison event whose handler always fails, and nAfter
// events; it returns the feed, the probe of the handler's calls and the
// handler.
func retryPoisonFeed(t *testing.T, e *env, nBefore, nAfter int) (before []string, poison domain.EventEnvelope[any], after []string, probe *parkProbe, h subscriptions.Handler) {
	t.Helper()
	before, poison, after = parkFeed(t, e, nBefore, nAfter)
	probe = newParkProbe()
	h = parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
		if ev.ID == poison.ID {
			return errParkPoison
		}
		return nil
	})
	return before, poison, after, probe, h
}

// TestRetryCountSharedByReplicas: two replicas of one subscriber attempt
// a poison event 1 + WithMaxRetries times in all, not each, then it is
// parked; every other event is handled once.
func TestRetryCountSharedByReplicas(t *testing.T) {
	t.Parallel()
	const maxRetries = 3
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			before, poison, after, probe, h := retryPoisonFeed(t, e, 2, 2)
			var subs []*subscriptions.Subscriber
			for range 2 {
				sub := parkSubscriber(t, e, "retry-replicas", h,
					subscriptions.WithParkingLot(e.Parking),
					subscriptions.WithMaxRetries(maxRetries),
					subscriptions.WithPollInterval(5*time.Millisecond),
					subscriptions.WithRetryBackoff(10*time.Millisecond, 10*time.Millisecond))
				subs = append(subs, sub)
				start(t, sub)
			}
			parked := parkWaitParked(t, subs[0], 1)
			waitCaughtUp(t, subs[0])
			require.Equal(t, 1+maxRetries, probe.count(poison.ID), "attempts at the poison event by both replicas together")
			require.Equal(t, poison.ID, parked[0].EventID)
			require.Equal(t, 1+maxRetries, parked[0].Attempts)
			parkRequireProcessed(t, e, probe, append(before, after...))
			require.Zero(t, retryAttempts(t, e, "retry-replicas"), "parking clears the count")
		})
	}
}

// TestRetryCountSurvivesRestart: a subscriber stopped while it waits to
// retry, and started again, continues the count instead of starting over.
func TestRetryCountSurvivesRestart(t *testing.T) {
	t.Parallel()
	const maxRetries = 3
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			_, poison, _, probe, h := retryPoisonFeed(t, e, 1, 1)
			newSub := func(backoff time.Duration) *subscriptions.Subscriber {
				return parkSubscriber(t, e, "retry-restart", h,
					subscriptions.WithParkingLot(e.Parking),
					subscriptions.WithMaxRetries(maxRetries),
					subscriptions.WithRetryBackoff(backoff, backoff))
			}
			// Two lives that each make attempts and stop in the backoff.
			for life := 1; life <= 2; life++ {
				sub := newSub(time.Hour)
				r := start(t, sub)
				retryWaitRetrying(t, e, sub, poison.ID, life)
				r.stop(t)
				require.Equal(t, life, probe.count(poison.ID))
			}
			sub := newSub(time.Millisecond)
			start(t, sub)
			parked := parkWaitParked(t, sub, 1)
			waitCaughtUp(t, sub)
			require.Equal(t, 1+maxRetries, probe.count(poison.ID), "attempts over three lives")
			require.Equal(t, 1+maxRetries, parked[0].Attempts)
		})
	}
}

// retryRunUntilPanic runs sub until its handler panics (the test's stand-in
// for a process that crashes mid-handler: the batch is abandoned, the
// process state lost) or until cond holds, and reports whether it
// panicked.
func retryRunUntilPanic(t *testing.T, sub *subscriptions.Subscriber, cond func() bool) bool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	panicked := make(chan bool, 1)
	go func() {
		defer func() { panicked <- recover() != nil }()
		_ = sub.Run(ctx)
	}()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case p := <-panicked:
			require.True(t, p, "Run returned without a panic")
			return true
		case <-tick.C:
			if cond() {
				cancel()
				require.False(t, <-panicked, "the handler panicked")
				return false
			}
		case <-deadline:
			t.Fatal("neither a panic nor the condition within 30s")
		}
	}
}

// TestRetryCrashingEventIsParked: an event whose handler crashes the
// process every time is parked after 1 + WithMaxRetries counted starts
// that ran it alone, plus one uncounted first crash, and the events
// around it are handled.
func TestRetryCrashingEventIsParked(t *testing.T) {
	t.Parallel()
	const maxRetries = 2
	for _, batch := range []int{1, 5} {
		for _, b := range envBackends() {
			t.Run(fmt.Sprintf("batch%d/%s", batch, b.Name), func(t *testing.T) {
				e := b.New(t)
				before, poison, after := parkFeed(t, e, 2, 2)
				probe := newParkProbe()
				h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
					if ev.ID == poison.ID {
						panic("retry test: the process crashes")
					}
					return nil
				})
				// 1 + maxRetries counted runs, and one uncounted: with
				// batches of several events, the first crash inside a batch
				// (not charged to any one event); with batches of one, the
				// first run, which continued from this process's own commit
				// and so skipped the committed record (see countAttempt).
				want := 2 + maxRetries
				for i := 1; i <= want; i++ {
					sub := parkSubscriber(t, e, "retry-crash", h,
						subscriptions.WithBatchSize(batch),
						subscriptions.WithParkingLot(e.Parking),
						subscriptions.WithMaxRetries(maxRetries))
					require.True(t, retryRunUntilPanic(t, sub, func() bool { return false }), "start %d", i)
					require.Equal(t, i, probe.count(poison.ID))
				}
				sub := parkSubscriber(t, e, "retry-crash", h,
					subscriptions.WithBatchSize(batch),
					subscriptions.WithParkingLot(e.Parking),
					subscriptions.WithMaxRetries(maxRetries))
				caughtUp := func() bool {
					lag, err := sub.Lag(context.Background())
					return err == nil && lag == 0
				}
				require.False(t, retryRunUntilPanic(t, sub, caughtUp))
				require.Equal(t, want, probe.count(poison.ID), "the parked event was not run again")
				parked, err := sub.ListParked(context.Background())
				require.NoError(t, err)
				require.Len(t, parked, 1)
				require.Equal(t, poison.ID, parked[0].EventID)
				require.Equal(t, 1+maxRetries, parked[0].Attempts)
				require.Contains(t, parked[0].Error, fmt.Sprintf("attempted %d times without completing", 1+maxRetries))
				parkRequireProcessed(t, e, probe, append(before, after...))
			})
		}
	}
}

// TestRetrySuccessClearsCount: an event that succeeds on a retry leaves
// no count behind, and the next failing event counts from 1.
func TestRetrySuccessClearsCount(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			_, poison, _ := parkFeed(t, e, 1, 1)
			probe := newParkProbe()
			failUntil := 3 // attempts 1 and 2 fail
			h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], n int) error {
				if ev.ID == poison.ID && n < failUntil {
					return errParkPoison
				}
				return nil
			})
			sub := parkSubscriber(t, e, "retry-clear", h,
				subscriptions.WithParkingLot(e.Parking),
				subscriptions.WithMaxRetries(5))
			r := start(t, sub)
			waitCaughtUp(t, sub)
			r.stop(t)
			require.Equal(t, 1, probe.handledCount(poison.ID))
			require.Equal(t, 3, probe.count(poison.ID))
			require.Zero(t, retryAttempts(t, e, "retry-clear"))
			parked, err := sub.ListParked(context.Background())
			require.NoError(t, err)
			require.Empty(t, parked)
		})
	}
}

// TestRetryResetClearsCount: ResetCheckpoint, ResetCheckpointWith and
// DeleteState forget the count of the event being retried.
func TestRetryResetClearsCount(t *testing.T) {
	t.Parallel()
	resets := []struct {
		name  string
		reset func(ctx context.Context, sub *subscriptions.Subscriber, position int64) error
	}{
		{"ResetCheckpoint", func(ctx context.Context, sub *subscriptions.Subscriber, position int64) error {
			return sub.ResetCheckpoint(ctx, position)
		}},
		{"ResetCheckpointWith", func(ctx context.Context, sub *subscriptions.Subscriber, position int64) error {
			return sub.ResetCheckpointWith(ctx, position, nil)
		}},
		{"DeleteState", func(ctx context.Context, sub *subscriptions.Subscriber, _ int64) error {
			return sub.DeleteState(ctx)
		}},
	}
	for _, rs := range resets {
		for _, b := range envBackends() {
			t.Run(rs.name+"/"+b.Name, func(t *testing.T) {
				e := b.New(t)
				_, poison, _, _, h := retryPoisonFeed(t, e, 0, 1)
				sub := parkSubscriber(t, e, "retry-reset", h,
					subscriptions.WithParkingLot(e.Parking),
					subscriptions.WithMaxRetries(5),
					subscriptions.WithRetryBackoff(time.Hour, time.Hour))
				r := start(t, sub)
				retryWaitRetrying(t, e, sub, poison.ID, 1)
				r.stop(t)
				require.NoError(t, rs.reset(context.Background(), sub, poison.Position-1))
				require.Zero(t, retryAttempts(t, e, "retry-reset"))
			})
		}
	}
}

// TestRetryHaltedCountInStatus: without a parking lot the subscriber
// halts on a failing event as before, and Status counts its attempts
// across restarts (each life here makes one attempt: the poll interval
// is longer than the test).
func TestRetryHaltedCountInStatus(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			_, poison, _, probe, h := retryPoisonFeed(t, e, 0, 2)
			for life := 1; life <= 3; life++ {
				sub := parkSubscriber(t, e, "retry-halted", h, subscriptions.WithPollInterval(time.Hour))
				r := start(t, sub)
				require.Eventually(t, func() bool {
					st, err := sub.Status(context.Background())
					return err == nil && st.State == subscriptions.StateHalted && st.Attempts == life &&
						st.Failing != nil && st.Failing.ID == poison.ID
				}, 30*time.Second, 5*time.Millisecond, "life %d", life)
				r.stop(t)
				require.Equal(t, life, probe.count(poison.ID))
				require.Equal(t, life, retryAttempts(t, e, "retry-halted"))
			}
		})
	}
}

// TestRetryOnePostgresConnection: on a Postgres pool of one connection,
// which the batch holds, the shared attempt record has no connection to be
// written on. The subscriber must not stall: the attempts are counted in
// the process (with a warning), and the poison event is still parked after
// 1 + WithMaxRetries attempts while the events around it are handled.
func TestRetryOnePostgresConnection(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	db := pg.Open(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)
	e := gormEnv(t, "postgres", db, pg)
	const maxRetries = 2
	_, attempts, parked := parkPoisonRun(t, e, "retry-one-conn", 3, maxRetries, time.Millisecond, 4*time.Millisecond)
	require.Len(t, attempts, 1+maxRetries)
	require.Equal(t, 1+maxRetries, parked.Attempts)
}

// TestRetryOptionsWithoutParkingLotWarn: WithMaxRetries and
// WithRetryBackoff are accepted without a parking lot (as the original
// module accepts them) though they change nothing there, and NewSubscriber
// says so once; with a lot, or without the options, it says nothing.
func TestRetryOptionsWithoutParkingLotWarn(t *testing.T) {
	t.Parallel()
	events, cps := infrastructure.NewMemoryStore(), subscriptions.NewMemoryCheckpointStore()
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	const warning = "apply only with WithParkingLot"
	for _, tc := range []struct {
		name string
		opts []subscriptions.SubscriberOption
		warn bool
	}{
		{"max retries", []subscriptions.SubscriberOption{subscriptions.WithMaxRetries(5)}, true},
		{"backoff", []subscriptions.SubscriberOption{subscriptions.WithRetryBackoff(time.Second, time.Minute)}, true},
		{"both", []subscriptions.SubscriberOption{subscriptions.WithMaxRetries(5), subscriptions.WithRetryBackoff(time.Second, time.Minute)}, true},
		{"with a parking lot", []subscriptions.SubscriberOption{subscriptions.WithMaxRetries(5), subscriptions.WithParkingLot(subscriptions.NewMemoryParkingLot())}, false},
		{"neither", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, logs := newLogger()
			_, err := subscriptions.NewSubscriber("retry-warn", events, cps, noop, append(tc.opts, subscriptions.WithLogger(logger))...)
			require.NoError(t, err)
			if tc.warn {
				require.Equal(t, 1, strings.Count(logs.String(), warning), logs.String())
			} else {
				require.NotContains(t, logs.String(), warning)
			}
		})
	}
}
