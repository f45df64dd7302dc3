package subscriptions_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// partLedger records a partitioned group test's handler calls: how often
// each event was handled per definition and tenant, the order each
// aggregate's events were handled in, and how many of one tenant's
// partitions of a definition ran at once in one group.
type partLedger struct {
	mu    sync.Mutex
	calls map[string]int     // "name/tenant/eventID"
	order map[string][]int64 // "name/tenant/aggregate": positions, as handled
	// inFlight and most count the calls running at once per
	// "group/name/tenant", and the most seen.
	inFlight, most map[string]int
}

func newPartLedger() *partLedger {
	return &partLedger{calls: map[string]int{}, order: map[string][]int64{}, inFlight: map[string]int{}, most: map[string]int{}}
}

// handler records each call of definition name in group (a replica's
// label) and, where the tenant has a database, writes the event into
// table through the batch transaction. Every call holds a little, so that
// partitions that may overlap do.
func (l *partLedger) handler(group, name, table string, envs map[string]*env) subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tenant := subscriptions.TenantFromContext(ctx)
		e := envs[tenant]
		if e == nil {
			return fmt.Errorf("handler of %s: unknown tenant %q", name, tenant)
		}
		slot := group + "/" + name + "/" + tenant
		l.mu.Lock()
		l.inFlight[slot]++
		l.most[slot] = max(l.most[slot], l.inFlight[slot])
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			l.inFlight[slot]--
			l.mu.Unlock()
		}()
		time.Sleep(200 * time.Microsecond) // a handler's work, so that partitions overlap
		if e.DB != nil {
			if err := e.project(ctx, table, ev); err != nil {
				return err
			}
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls[name+"/"+tenant+"/"+ev.ID]++
		key := name + "/" + tenant + "/" + ev.AggregateID
		l.order[key] = append(l.order[key], ev.Position)
		return nil
	}
}

// requireInOrder requires every aggregate's events handled in feed order
// (on a database the handlers of a rolled-back batch ran too, so only an
// event handled before an earlier one counts).
func (l *partLedger) requireInOrder(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.NotEmpty(t, l.order)
	for key, positions := range l.order {
		for i := 1; i < len(positions); i++ {
			require.GreaterOrEqual(t, positions[i], positions[i-1], "%s handled out of order: %v", key, positions)
		}
	}
}

// requireOnce requires every event of e's feed handled once by name: the
// committed rows of table on a database, the calls on memory.
func (l *partLedger) requireOnce(t *testing.T, e *env, tenant, name, table string) {
	t.Helper()
	want := faultFeedIDs(t, e.Events)
	require.NotEmpty(t, want)
	if e.DB != nil {
		got := projected(t, e.DB, table)
		slices.Sort(got)
		slices.Sort(want)
		require.Equal(t, want, got, "%s/%s: every event committed once", name, tenant)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range want {
		require.Equal(t, 1, l.calls[name+"/"+tenant+"/"+id], "%s/%s: event %s", name, tenant, id)
	}
}

// waitGroupAtHead waits until every row of g (every tenant, every
// definition, every partition) has no lag.
func waitGroupAtHead(t *testing.T, g *subscriptions.Group) {
	t.Helper()
	require.Eventually(t, func() bool {
		rows, err := g.Status(context.Background())
		if err != nil || len(rows) == 0 {
			return false
		}
		for _, st := range rows {
			if st.Lag != 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "the group did not catch up")
}

// partTable creates a projection table without a key in e (a second
// committed delivery shows as a second row); "" on memory.
func partTable(t *testing.T, e *env, table string) string {
	t.Helper()
	if e.DB == nil {
		return ""
	}
	require.NoError(t, e.DB.Exec("CREATE TABLE "+table+" (event_id text NOT NULL, position bigint NOT NULL)").Error)
	return table
}

// TestGroupPartitioned runs a partitioned definition (4 partitions, at
// most 2 at once per tenant) beside a plain one over two tenants, in two
// groups sharing them as two processes would (on Postgres each through
// pools of its own), on every backend; events are appended before and
// while they run, over 20 aggregates (each partition has some). Every
// event is committed once per definition and tenant, each aggregate's
// events are handled in feed order, no group ran more than 2 of a
// tenant's partitions at once, and the partitioned definition's Status
// rows name the tenant and show its 4 partitions caught up.
func TestGroupPartitioned(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			envs := map[string]*env{}
			var tenants []string
			seq := map[string]map[string]int{}
			for i := range 2 {
				e := b.New(t)
				tenant := fmt.Sprintf("part-%d", i)
				envs[tenant], seq[tenant] = e, map[string]int{}
				tenants = append(tenants, tenant)
				partTable(t, e, "grp_parts")
				partTable(t, e, "grp_plain")
				partAppend(t, e.Events, seq[tenant], 20, 40)
			}
			ledger := newPartLedger()
			newGroup := func(label string, replica bool) *subscriptions.Group {
				opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll), subscriptions.WithBatchSize(5)}
				g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{
					{Name: "parts", Handler: ledger.handler(label, "parts", "grp_parts", envs),
						Options: append(slices.Clone(opts), subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2))},
					{Name: "plain", Handler: ledger.handler(label, "plain", "grp_plain", envs), Options: opts},
				}, subscriptions.WithGroupWorkers(4), subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
				require.NoError(t, err)
				for _, tenant := range tenants {
					e := envs[tenant]
					feed := subscriptions.Feed{Tenant: tenant, Database: b.Name + "/" + tenant, Events: e.Events, Checkpoints: e.Checkpoints, Parking: e.Parking}
					if replica {
						feed.Events, feed.Checkpoints, feed.Parking = partReplica(t, e)
					}
					require.NoError(t, g.Add(feed))
				}
				return g
			}
			first, second := newGroup("a", false), newGroup("b", true)
			runGroup(t, first)
			runGroup(t, second)
			for _, tenant := range tenants {
				partAppend(t, envs[tenant].Events, seq[tenant], 20, 40)
			}
			waitGroupAtHead(t, first)

			for _, tenant := range tenants {
				for _, name := range []string{"parts", "plain"} {
					ledger.requireOnce(t, envs[tenant], tenant, name, "grp_"+name)
				}
			}
			ledger.requireInOrder(t)
			ledger.mu.Lock()
			for slot, most := range ledger.most {
				require.LessOrEqual(t, most, 2, "%s: partitions at once (WithConcurrency(2))", slot)
			}
			ledger.mu.Unlock()
			for _, g := range []*subscriptions.Group{first, second} {
				rows, err := g.Status(ctx)
				require.NoError(t, err)
				require.Len(t, rows, 4)
				for _, st := range rows {
					require.Contains(t, tenants, st.Tenant)
					require.NotEqual(t, subscriptions.StateStopped, st.State, "%s/%s", st.Tenant, st.Subscriber)
					if st.Subscriber == "parts" {
						require.Len(t, st.Partitions, 4)
						for _, p := range st.Partitions {
							require.Zero(t, p.Lag)
							require.Positive(t, p.Position, "every partition has events")
						}
					} else {
						require.Nil(t, st.Partitions)
					}
				}
			}
		})
	}
}

// count returns how often name handled events of tenant.
func (l *partLedger) count(name, tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for key, c := range l.calls {
		if len(key) > len(name)+len(tenant)+2 && key[:len(name)+len(tenant)+2] == name+"/"+tenant+"/" {
			n += c
		}
	}
	return n
}

// TestGroupPartitionedOperations tries a group's partitioned definition
// against what an operator does to it, on every backend: a tenant whose
// name has checkpoints for another partition count has that definition
// stopped (its Status says why) while its plain definition and the other
// tenant run on; Pause holds every partition of the name (the plain
// definition goes on with the same events) and Resume lets them go on;
// ResetCheckpoint(0) through the group's Subscriber hands every event to
// every partition again, on a group that is otherwise idle; Remove drains
// and stops the tenant's partitions.
func TestGroupPartitionedOperations(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			good, other := b.New(t), b.New(t)
			envs := map[string]*env{"good": good, "other": other}
			seq := map[string]int{}
			for _, e := range envs {
				partTable(t, e, "grp_parts")
				partTable(t, e, "grp_plain")
				partAppend(t, e.Events, seq, 20, 30)
			}
			// "other" ran parts with 3 partitions before.
			before, err := subscriptions.NewSubscriber("parts", other.Events, other.Checkpoints,
				func(context.Context, domain.EventEnvelope[any]) error { return nil },
				subscriptions.WithPartitions(3), subscriptions.WithPollInterval(groupPoll), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			run := start(t, before)
			waitCaughtUp(t, before)
			run.stop(t)

			ledger := newPartLedger()
			opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll), subscriptions.WithBatchSize(5)}
			g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{
				{Name: "parts", Handler: ledger.handler("g", "parts", "grp_parts", envs),
					Options: append(slices.Clone(opts), subscriptions.WithPartitions(4), subscriptions.WithConcurrency(4))},
				{Name: "plain", Handler: ledger.handler("g", "plain", "grp_plain", envs), Options: opts},
			}, subscriptions.WithGroupWorkers(3), subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
			require.NoError(t, err)
			for tenant, e := range envs {
				require.NoError(t, g.Add(subscriptions.Feed{Tenant: tenant, Database: tenant, Events: e.Events, Checkpoints: e.Checkpoints, Parking: e.Parking}))
			}
			runGroup(t, g)
			goodParts, err := g.Subscriber("good", "parts")
			require.NoError(t, err)
			otherParts, err := g.Subscriber("other", "parts")
			require.NoError(t, err)
			otherPlain, err := g.Subscriber("other", "plain")
			require.NoError(t, err)
			waitCaughtUp(t, goodParts)
			waitCaughtUp(t, otherPlain)
			ledger.requireOnce(t, good, "good", "parts", "grp_parts")
			ledger.requireOnce(t, other, "other", "plain", "grp_plain")

			// The count: refused for "other" alone, with the reason.
			_, err = otherParts.Status(ctx)
			require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged)
			rows, err := g.Status(ctx, "other")
			require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged)
			require.Len(t, rows, 1, "the plain definition's row")
			require.Zero(t, ledger.count("parts", "other"), "no partition of a changed count ran")

			// Pause: the plain definition handles the new events, the
			// partitions none, for several poll intervals.
			require.NoError(t, goodParts.Pause(ctx, "maintenance"))
			paused := ledger.count("parts", "good")
			partAppend(t, good.Events, seq, 20, 20)
			goodPlain, err := g.Subscriber("good", "plain")
			require.NoError(t, err)
			waitCaughtUp(t, goodPlain)
			require.Never(t, func() bool { return ledger.count("parts", "good") != paused }, 5*groupPoll, groupPoll/4,
				"a partition ran while its name was paused")
			st, err := goodParts.Status(ctx)
			require.NoError(t, err)
			require.True(t, st.Paused)
			require.Positive(t, st.Lag)
			require.NoError(t, goodParts.Healthy(ctx), "a paused group subscriber is not stuck")
			require.NoError(t, goodParts.Resume(ctx))
			waitCaughtUp(t, goodParts)
			ledger.requireOnce(t, good, "good", "parts", "grp_parts")

			ledger.requireInOrder(t)

			// Reset to 0: every event once more, though nothing is appended.
			events := len(faultFeedIDs(t, good.Events))
			handled := ledger.count("parts", "good")
			require.NoError(t, goodParts.ResetCheckpoint(ctx, 0))
			require.Eventually(t, func() bool { return ledger.count("parts", "good") >= handled+events }, 60*time.Second, 5*time.Millisecond,
				"the reset partitions handle the feed again")
			waitCaughtUp(t, goodParts)
			if good.DB != nil {
				require.Len(t, projected(t, good.DB, "grp_parts"), 2*events, "each event committed once more after the reset")
			}

			// Remove: nothing of the tenant runs after it returns.
			require.NoError(t, g.Remove(ctx, "good"))
			removed := ledger.count("parts", "good")
			partAppend(t, good.Events, seq, 20, 10)
			require.Never(t, func() bool { return ledger.count("parts", "good") != removed }, 5*groupPoll, groupPoll/4,
				"a removed tenant's partition ran")
			require.NotContains(t, g.Tenants(), "good")
		})
	}
}

// TestGroupPartitionedRepartitionedElsewhere repartitions a group's
// partitioned definition of one tenant from another process (4 -> 2)
// while the group runs, on every backend: the group stops that definition
// for the tenant (logged, and its Status says why) and handles none of
// its later events, while the plain definition goes on; a group built
// with the new count then handles the rest, every event committed once.
func TestGroupPartitionedRepartitionedElsewhere(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := b.New(t)
			envs := map[string]*env{"t": e}
			seq := map[string]int{}
			partTable(t, e, "grp_parts")
			partTable(t, e, "grp_plain")
			partAppend(t, e.Events, seq, 20, 30)
			ledger := newPartLedger()
			newGroup := func(label string, parts int) (*subscriptions.Group, *logBuffer) {
				logger, logs := newLogger()
				opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll), subscriptions.WithBatchSize(5)}
				g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{
					{Name: "parts", Handler: ledger.handler(label, "parts", "grp_parts", envs),
						Options: append(slices.Clone(opts), subscriptions.WithPartitions(parts), subscriptions.WithConcurrency(2))},
					{Name: "plain", Handler: ledger.handler(label, "plain", "grp_plain", envs), Options: opts},
				}, subscriptions.WithGroupWorkers(3), subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(logger))
				require.NoError(t, err)
				require.NoError(t, g.Add(subscriptions.Feed{Tenant: "t", Events: e.Events, Checkpoints: e.Checkpoints, Parking: e.Parking}))
				return g, logs
			}
			g, logs := newGroup("old", 4)
			running := runGroup(t, g)
			waitGroupAtHead(t, g)

			elsewhere, err := subscriptions.NewSubscriber("parts", e.Events, e.Checkpoints, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				if e.DB == nil {
					return nil
				}
				return e.project(ctx, "grp_parts", ev)
			}, subscriptions.WithPartitions(4), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			require.NoError(t, elsewhere.Repartition(ctx, 2))

			parts, err := g.Subscriber("t", "parts")
			require.NoError(t, err)
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "cannot run for this tenant") }, 30*time.Second, 5*time.Millisecond,
				"the group stops the repartitioned definition")
			_, err = parts.Status(ctx)
			require.ErrorIs(t, err, subscriptions.ErrPartitionsChanged)
			stopped := ledger.count("parts", "t")
			partAppend(t, e.Events, seq, 20, 20)
			plain, err := g.Subscriber("t", "plain")
			require.NoError(t, err)
			waitCaughtUp(t, plain)
			require.Never(t, func() bool { return ledger.count("parts", "t") != stopped }, 5*groupPoll, groupPoll/4,
				"the old count handled an event after the repartition")
			running.stop(t)

			g2, _ := newGroup("new", 2)
			runGroup(t, g2)
			waitGroupAtHead(t, g2)
			ledger.requireOnce(t, e, "t", "plain", "grp_plain")
			ledger.requireOnce(t, e, "t", "parts", "grp_parts")
			ledger.requireInOrder(t)
		})
	}
}

// gatedPositions is a memory checkpoint store whose Positions of the
// partitions alone (the first scan's read, not a read with the count row)
// signals entered and then waits for release, answering as a statement
// that completed just as its context was cancelled would.
type gatedPositions struct {
	*subscriptions.MemoryCheckpointStore
	parts   int
	armed   *atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g gatedPositions) Positions(ctx context.Context, names []string) ([]int64, error) {
	if len(names) == g.parts && g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
		return g.MemoryCheckpointStore.Positions(context.Background(), names)
	}
	return g.MemoryCheckpointStore.Positions(ctx, names)
}

// TestGroupRemoveDuringFirstScan removes a tenant while its partitioned
// definition's first scan reads the partitions' checkpoints: Remove ends
// the dormant partition units (their runner set to nil) while the scan's
// worker then writes each partition's runner.known without the group's
// mu. Run must not panic (and -race must not report the write).
func TestGroupRemoveDuringFirstScan(t *testing.T) {
	t.Parallel()
	gt := groupMemoryTenants("rmscan", 1)[0]
	cps := gatedPositions{MemoryCheckpointStore: subscriptions.NewMemoryCheckpointStore(), parts: 2, armed: &atomic.Bool{},
		entered: make(chan struct{}), release: make(chan struct{})}
	cps.armed.Store(true)
	gt.feed.Checkpoints = cps
	handler := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "parts", Handler: handler, Options: []subscriptions.SubscriberOption{
		subscriptions.WithPollInterval(groupPoll), subscriptions.WithPartitions(2),
	}}}, subscriptions.WithGroupWorkers(1), subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	appendN(t, gt.feed.Events, "E", 0, 3)
	require.NoError(t, g.Add(gt.feed))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- fmt.Errorf("Run panicked: %v", v)
			}
		}()
		done <- g.Run(ctx)
	}()
	select {
	case <-cps.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first scan did not read the partitions' checkpoints")
	}
	// Remove with a context already done: it ends the units that do not
	// run and returns at once (the scan still runs).
	gone, stop := context.WithCancel(context.Background())
	stop()
	require.Error(t, g.Remove(gone, gt.feed.Tenant))
	close(cps.release)
	rmCtx, rmCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rmCancel()
	removeErr := g.Remove(rmCtx, gt.feed.Tenant)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	require.NoError(t, removeErr)
}
