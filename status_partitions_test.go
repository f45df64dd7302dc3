package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// statusAggregateIn returns an aggregate ID whose events fall in
// partition p of n.
func statusAggregateIn(p, n int, prefix string) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if subscriptions.PartitionOf(id, n) == p {
			return id
		}
	}
}

// TestStatusHungPartitionIsStuck: a partition whose handler hangs is
// reported by Healthy as stuck, naming it, while another partition goes on
// committing events; Status shows which partition stands still. Memory and
// Postgres (GORM and pgx): there partitions commit at once (on SQLite the hung batch
// holds the database's write lock, and every partition waits).
func TestStatusHungPartitionIsStuck(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		if b.Name != "memory" && !b.Postgres {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			const n = 2
			hung, busy := statusAggregateIn(0, n, "hung"), statusAggregateIn(1, n, "busy")
			release := make(chan struct{})
			var releaseOnce sync.Once
			defer releaseOnce.Do(func() { close(release) })
			var handled atomic.Int64
			sub, err := subscriptions.NewSubscriber("status-hung", e.Events, e.Checkpoints, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				if ev.AggregateID == hung {
					<-release
				}
				handled.Add(1)
				return nil
			}, subscriptions.WithPartitions(n), subscriptions.WithConcurrency(2), subscriptions.WithBatchSize(1),
				subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithStuckThreshold(300*time.Millisecond),
				subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			run := start(t, sub)
			append1 := func(agg string) {
				ev := domain.NewEventEnvelope[any](map[string]any{}, agg, "status.hung", 0)
				require.NoError(t, e.Events.Append(context.Background(), agg, -1, ev))
			}
			append1(hung)
			stop := make(chan struct{})
			writerDone := make(chan struct{})
			go func() { // the other partition keeps committing
				defer close(writerDone)
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					ev := domain.NewEventEnvelope[any](map[string]any{}, busy, "status.hung", 0)
					_ = e.Events.Append(context.Background(), busy, -1, ev)
				}
			}()
			var healthErr error
			require.Eventually(t, func() bool {
				healthErr = sub.Healthy(context.Background())
				return errors.Is(healthErr, subscriptions.ErrSubscriberStuck)
			}, 30*time.Second, 10*time.Millisecond, "a hung partition must be reported while the other commits")
			require.Contains(t, healthErr.Error(), "partition 0 of 2")
			require.Positive(t, handled.Load(), "the other partition committed meanwhile")
			st, err := sub.Status(context.Background())
			require.NoError(t, err)
			require.Len(t, st.Partitions, n)
			require.Equal(t, subscriptions.StateRunning, st.Partitions[0].State)
			require.EqualValues(t, 1, st.Partitions[0].Lag)
			require.Less(t, st.Partitions[0].ProgressAt, st.Partitions[1].ProgressAt, "the hung partition's progress stands still")
			close(stop)
			<-writerDone
			releaseOnce.Do(func() { close(release) })
			waitCaughtUp(t, sub)
			require.Eventually(t, func() bool { return sub.Healthy(context.Background()) == nil }, 30*time.Second, 10*time.Millisecond)
			run.stop(t)
		})
	}
}

// TestStatusPartitionedUnderAppends: a readiness probe and a status reader
// on a partitioned subscriber while appends flow never see a state that
// did not exist (a checkpoint ahead of the feed head: the head read before
// a batch committed and the checkpoints after); a caught-up partitioned
// subscriber reports idle, as an unpartitioned one does, and each of its
// partitions.
func TestStatusPartitionedUnderAppends(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			sub, err := subscriptions.NewSubscriber("status-part", e.Events, e.Checkpoints,
				func(context.Context, domain.EventEnvelope[any]) error { return nil },
				subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2), subscriptions.WithBatchSize(3),
				subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			run := start(t, sub)
			seq := map[string]int{}
			done := make(chan struct{})
			var probes atomic.Int64
			var bad []string
			var mu sync.Mutex
			probeDone := make(chan struct{})
			go func() {
				defer close(probeDone)
				for {
					select {
					case <-done:
						return
					default:
					}
					for _, err := range []error{sub.Healthy(context.Background()), statusErr(sub)} {
						if errors.Is(err, subscriptions.ErrCheckpointAhead) {
							mu.Lock()
							bad = append(bad, err.Error())
							mu.Unlock()
						}
					}
					if _, err := sub.Lag(context.Background()); errors.Is(err, subscriptions.ErrCheckpointAhead) {
						mu.Lock()
						bad = append(bad, err.Error())
						mu.Unlock()
					}
					probes.Add(1)
				}
			}()
			pace := time.NewTicker(2 * time.Millisecond) // an appender's pace
			for i := 0; i < 40; i++ {
				<-pace.C
				partAppend(t, e.Events, seq, 8, 5)
			}
			pace.Stop()
			close(done)
			<-probeDone
			mu.Lock()
			require.Empty(t, bad, "%d of %d probes saw a checkpoint ahead of the head", len(bad), probes.Load())
			mu.Unlock()
			waitCaughtUp(t, sub)
			st := statusWait(t, sub, "idle once caught up", func(st subscriptions.Status) bool { return st.State == subscriptions.StateIdle })
			require.Len(t, st.Partitions, 4)
			for _, ps := range st.Partitions {
				require.Equal(t, subscriptions.StateIdle, ps.State, "partition %d", ps.Partition)
				require.Zero(t, ps.Lag)
			}
			run.stop(t)
			st, err = sub.Status(context.Background())
			require.NoError(t, err)
			require.Equal(t, subscriptions.StateStopped, st.State)
			for _, ps := range st.Partitions {
				require.Equal(t, subscriptions.StateStopped, ps.State)
			}
		})
	}
}

func statusErr(sub *subscriptions.Subscriber) error {
	_, err := sub.Status(context.Background())
	return err
}
