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
)

// TestGroupNoticesChangesMadeElsewhere resets, pauses and resumes idle
// tenants through stores of their own, as another process or the command
// line would (no Group.Subscriber, so the group is not told): a memory
// tenant and two Postgres schemas of one database (their checkpoints
// probed in one statement). No event is appended for the reset: the
// group's checkpoint probe notices it within a poll interval and replays
// the tenant. A tenant paused elsewhere, whose new events its unit skips,
// runs them once resumed elsewhere.
func TestGroupNoticesChangesMadeElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tenants := append(groupMemoryTenants("elsewhere", 1), groupPostgresTenants(t, "elsewhere", 2, "grp_a")...)
	names := map[string]string{"proj": "grp_a"}
	ledger := newGroupLedger()
	g, err := subscriptions.NewGroup(groupDefs(ledger, names),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for _, gt := range tenants {
		appendN(t, gt.feed.Events, "E", 0, 2)
		require.NoError(t, g.Add(gt.feed))
	}
	runGroup(t, g)
	ledger.waitCalls(t, 2*len(tenants))
	waitCheckpoints(t, tenants, names)

	// elsewhere is the checkpoint store another process has of gt's.
	elsewhere := func(gt *groupTenant) subscriptions.CheckpointStore {
		if gt.pg == nil {
			return gt.feed.Checkpoints // memory: one store, but not through the group
		}
		return gt.reopen(t).feed.Checkpoints
	}
	for _, gt := range tenants {
		require.NoError(t, elsewhere(gt).Reset(ctx, "proj", 0))
	}
	ledger.waitCalls(t, 4*len(tenants)) // every event replayed, none appended
	waitCheckpoints(t, tenants, names)

	for _, gt := range tenants {
		_, err := elsewhere(gt).(subscriptions.Pauser).Pause(ctx, "proj", []string{"proj"}, "elsewhere")
		require.NoError(t, err)
		appendN(t, gt.feed.Events, "E", 2, 1)
	}
	// Several poll intervals (probes and polls) pass with the new events
	// unhandled.
	require.Never(t, func() bool { return ledger.total() != 4*len(tenants) }, 5*groupPoll, 5*time.Millisecond,
		"a paused tenant runs nothing")
	for _, gt := range tenants {
		require.NoError(t, elsewhere(gt).(subscriptions.Pauser).Resume(ctx, "proj"))
	}
	ledger.waitCalls(t, 5*len(tenants))
	waitCheckpoints(t, tenants, names)
}

// TestGroupFirstRunCatchUp runs a definition with WithFirstRunCatchUp
// over a memory tenant and a SQLite one that have history: each tenant's
// first cycle records the catch-up, so its history is delivered as
// DeliveryCatchUp, and an event appended afterwards as live.
func TestGroupFirstRunCatchUp(t *testing.T) {
	tenants := append(groupMemoryTenants("catchup", 1), groupSQLiteTenants(t, "catchup", 1)...)
	var mu sync.Mutex
	kinds := map[string][]subscriptions.DeliveryKind{}
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		mu.Lock()
		defer mu.Unlock()
		tenant := subscriptions.TenantFromContext(ctx)
		kinds[tenant] = append(kinds[tenant], subscriptions.DeliveryFrom(ctx).Kind)
		return nil
	}
	seen := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, gt := range tenants {
				if len(kinds[gt.feed.Tenant]) < n {
					return false
				}
			}
			return true
		}
	}
	g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "v2", Handler: handler, Options: []subscriptions.SubscriberOption{
		subscriptions.WithPollInterval(groupPoll), subscriptions.WithFirstRunCatchUp(0),
	}}}, subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for _, gt := range tenants {
		appendN(t, gt.feed.Events, "E", 0, 3)
		require.NoError(t, g.Add(gt.feed))
	}
	runGroup(t, g)
	require.Eventually(t, seen(3), 10*time.Second, time.Millisecond)
	for _, gt := range tenants {
		appendN(t, gt.feed.Events, "E", 3, 1)
	}
	require.Eventually(t, seen(4), 10*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	catchUp, live := subscriptions.DeliveryCatchUp, subscriptions.DeliveryLive
	for _, gt := range tenants {
		require.Equal(t, []subscriptions.DeliveryKind{catchUp, catchUp, catchUp, live}, kinds[gt.feed.Tenant], gt.feed.Tenant)
	}
}

// runProbedMemoryTenant runs a one-worker group of names over one memory
// tenant whose checkpoint store is cps, after appending backlog events to
// it, and waits until they were handled; logs holds the group's log.
func runProbedMemoryTenant(t *testing.T, prefix string, cps subscriptions.CheckpointStore, names map[string]string, backlog int) (*groupTenant, *groupLedger, *logBuffer) {
	t.Helper()
	logger, logs := newLogger()
	gt := groupMemoryTenants(prefix, 1)[0]
	gt.feed.Checkpoints = cps
	ledger := newGroupLedger()
	g, err := subscriptions.NewGroup(groupDefs(ledger, names), subscriptions.WithGroupWorkers(1),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(logger))
	require.NoError(t, err)
	require.NoError(t, g.Add(gt.feed))
	appendN(t, gt.feed.Events, "Before", 0, backlog)
	runGroup(t, g)
	ledger.waitCalls(t, backlog)
	return gt, ledger, logs
}

// memoryWrapper is a test's CheckpointProber around a memory checkpoint
// store: probeWrapped answers its calls from the stores it wraps.
type memoryWrapper interface {
	wrapped() *subscriptions.MemoryCheckpointStore
}

// probeWrapped is mem's ProbeCheckpoints of the memory stores inside
// stores (each a memoryWrapper, as the group hands a prober its tenants'
// stores).
func probeWrapped(ctx context.Context, mem *subscriptions.MemoryCheckpointStore, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
	inner := make([]subscriptions.CheckpointStore, len(stores))
	for i, s := range stores {
		inner[i] = s.(memoryWrapper).wrapped()
	}
	return mem.ProbeCheckpoints(ctx, inner, names)
}

// shortProber is a memory checkpoint store whose CheckpointProber answers
// with no rows at all, as a broken third-party prober might.
type shortProber struct {
	*subscriptions.MemoryCheckpointStore
}

func (shortProber) ProbeCheckpoints(context.Context, []subscriptions.CheckpointStore, []string) ([][]subscriptions.CheckpointProbe, error) {
	return nil, nil
}

// TestGroupProbeAnswerOfWrongShape gives a group a CheckpointProber whose
// answer lacks the stores it was asked for: the group logs the failed
// probe and goes on, the tenant's events handled once each, before and
// after probes ran, instead of indexing past the answer.
func TestGroupProbeAnswerOfWrongShape(t *testing.T) {
	t.Parallel()
	names := map[string]string{"short": ""}
	gt, ledger, logs := runProbedMemoryTenant(t, "short", shortProber{subscriptions.NewMemoryCheckpointStore()}, names, 3)
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), "probing the tenants' checkpoints failed") >= 2
	}, 30*time.Second, 5*time.Millisecond, "the probe's bad answer was not logged as a failure, twice")
	appendN(t, gt.feed.Events, "After", 3, 2)
	ledger.waitCalls(t, 5)
	ledger.requireOnce(t, []*groupTenant{gt}, names)
}

// refusingProber is a memory checkpoint store whose CheckpointProber reads
// its stores until refuse is set, and then refuses them
// (errors.ErrUnsupported), as a database's prober does once a tenant of
// another kind joins it.
type refusingProber struct {
	*subscriptions.MemoryCheckpointStore
	refuse *atomic.Bool
}

func (r refusingProber) ProbeCheckpoints(ctx context.Context, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
	if r.refuse.Load() {
		return nil, fmt.Errorf("refusingProber: %w", errors.ErrUnsupported)
	}
	return probeWrapped(ctx, r.MemoryCheckpointStore, stores, names)
}

func (r refusingProber) wrapped() *subscriptions.MemoryCheckpointStore {
	return r.MemoryCheckpointStore
}

// TestGroupPausedTenantPollsOnceProbesRefused pauses an idle tenant
// elsewhere (through its store, the group not told) and appends to it:
// its unit goes dormant on the pause the checkpoint probe reads. Then the
// database's prober starts refusing, and the tenant is resumed elsewhere:
// with no probe left to read the resume, the unit polls for it again, and
// the event is handled.
func TestGroupPausedTenantPollsOnceProbesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := subscriptions.NewMemoryCheckpointStore()
	refuse := &atomic.Bool{}
	names := map[string]string{"proj": ""}
	gt, ledger, logs := runProbedMemoryTenant(t, "refused", refusingProber{mem, refuse}, names, 2)

	_, err := mem.Pause(ctx, "proj", []string{"proj"}, "elsewhere")
	require.NoError(t, err)
	appendN(t, gt.feed.Events, "E", 2, 1)
	require.Never(t, func() bool { return ledger.total() != 2 }, 5*groupPoll, 5*time.Millisecond, "a paused tenant runs nothing")
	refuse.Store(true)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "checkpoints cannot be read together") }, 30*time.Second, 5*time.Millisecond,
		"the prober's refusal was not logged")
	require.NoError(t, mem.Resume(ctx, "proj"))
	ledger.waitCalls(t, 3)
	ledger.requireOnce(t, []*groupTenant{gt}, names)
}

// hangingProber is a memory checkpoint store whose CheckpointProber, once
// hang is closed, hangs until release is closed, as a checkpoint
// statement stuck behind a lock would.
type hangingProber struct {
	*subscriptions.MemoryCheckpointStore
	hang, release chan struct{}
	// hung counts the calls that hung; twice, that two ran at once.
	hung, inFlight, twice *atomic.Int32
}

func (h hangingProber) ProbeCheckpoints(ctx context.Context, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
	if h.inFlight.Add(1) > 1 {
		h.twice.Add(1)
	}
	defer h.inFlight.Add(-1)
	select {
	case <-h.hang:
		h.hung.Add(1)
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	default:
	}
	return probeWrapped(ctx, h.MemoryCheckpointStore, stores, names)
}

func (h hangingProber) wrapped() *subscriptions.MemoryCheckpointStore { return h.MemoryCheckpointStore }

// TestGroupSlowCheckpointProbeKeepsDatabaseUp makes the checkpoint probe
// of a tenant's database hang for several poll intervals, after its heads
// were read: the database answered, so it is not put down (it was, when
// the probe waited for both reads: a slow checkpoint statement held the
// tenants of a healthy database), no second checkpoint probe runs beside
// it, and events appended during the hang are handled once it ends (or
// once the group gives the statement up, after a second).
func TestGroupSlowCheckpointProbeKeepsDatabaseUp(t *testing.T) {
	t.Parallel()
	prober := hangingProber{subscriptions.NewMemoryCheckpointStore(), make(chan struct{}), make(chan struct{}), &atomic.Int32{}, &atomic.Int32{}, &atomic.Int32{}}
	names := map[string]string{"proj": ""}
	gt, ledger, logs := runProbedMemoryTenant(t, "hanging", prober, names, 2)
	close(prober.hang)
	require.Eventually(t, func() bool { return prober.hung.Load() > 0 }, 30*time.Second, time.Millisecond, "the checkpoint probe hangs")
	appendN(t, gt.feed.Events, "During", 2, 3)
	require.Never(t, func() bool { return strings.Contains(logs.String(), "takes longer than the poll interval") }, 5*groupPoll, groupPoll/4,
		"a database whose heads answered was put down for its checkpoint statement")
	require.Zero(t, prober.twice.Load(), "no second checkpoint probe while one hangs")
	close(prober.release)
	ledger.waitCalls(t, 5)
	ledger.requireOnce(t, []*groupTenant{gt}, names)
	require.NotContains(t, logs.String(), "takes longer than the poll interval")
}

// probeStatementTime is how long concurrentProber's statement takes.
const probeStatementTime = 20 * time.Millisecond

// concurrentProber is a memory checkpoint store whose CheckpointProber
// takes a while and records how many of its calls ran at once.
type concurrentProber struct {
	*subscriptions.MemoryCheckpointStore
	inFlight, most *atomic.Int32
}

func (c concurrentProber) ProbeCheckpoints(ctx context.Context, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			break
		}
	}
	select { // a checkpoint statement that takes a little
	case <-time.After(probeStatementTime):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return probeWrapped(ctx, c.MemoryCheckpointStore, stores, names)
}

func (c concurrentProber) wrapped() *subscriptions.MemoryCheckpointStore {
	return c.MemoryCheckpointStore
}

// TestGroupProbesOneStatementAtATime runs a group over four tenants with
// no Database (each a database of its own, as the Group documentation
// says) whose checkpoint probe takes a tenth of a poll interval: the
// budget (workers + 1: the probe, one statement at a time) allows one
// probe statement at once, so the probe waits for a database's checkpoint
// statement before it goes on to the next database (it did not, once).
func TestGroupProbesOneStatementAtATime(t *testing.T) {
	t.Parallel()
	const poll = 200 * time.Millisecond
	inFlight, most := &atomic.Int32{}, &atomic.Int32{}
	tenants := groupMemoryTenants("budget", 4)
	ledger := newGroupLedger()
	names := map[string]string{"proj": ""}
	g, err := subscriptions.NewGroup(groupDefs(ledger, names), subscriptions.WithGroupWorkers(1),
		subscriptions.WithGroupPollInterval(poll), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for _, gt := range tenants {
		gt.feed.Checkpoints = concurrentProber{subscriptions.NewMemoryCheckpointStore(), inFlight, most}
		appendN(t, gt.feed.Events, "E", 0, 1)
		require.NoError(t, g.Add(gt.feed))
	}
	runGroup(t, g)
	ledger.waitCalls(t, len(tenants))
	require.Never(t, func() bool { return most.Load() > 1 }, 10*poll, poll/20,
		"probe statements at once: the budget counts one")
}

// slowOnceProber is a memory checkpoint store whose CheckpointProber
// counts its calls (started) and, once armed, holds the next one until
// release is closed: a checkpoint statement that takes a while.
type slowOnceProber struct {
	*subscriptions.MemoryCheckpointStore
	armed   *atomic.Bool
	started *atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (o slowOnceProber) ProbeCheckpoints(ctx context.Context, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
	o.started.Add(1)
	if o.armed.CompareAndSwap(true, false) {
		close(o.entered)
		select {
		case <-o.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return probeWrapped(ctx, o.MemoryCheckpointStore, stores, names)
}

func (o slowOnceProber) wrapped() *subscriptions.MemoryCheckpointStore {
	return o.MemoryCheckpointStore
}

// TestGroupWakeDuringCheckpointProbe sends a wake signal for an event
// appended while the database's checkpoint statement runs, which the
// wake's probe skips (one probe statement at a time): once the statement
// returns the database is probed again for the wake, so the event is
// handled before the next poll interval's probe starts (it waited for
// that probe, once).
func TestGroupWakeDuringCheckpointProbe(t *testing.T) {
	t.Parallel()
	const poll = 2 * time.Second
	gt := groupMemoryTenants("wakeck", 1)[0]
	prober := slowOnceProber{subscriptions.NewMemoryCheckpointStore(), &atomic.Bool{}, &atomic.Int32{}, make(chan struct{}), make(chan struct{})}
	gt.feed.Checkpoints = prober
	var handled atomic.Int32
	probesAtHandling := make(chan int32, 10)
	wake := make(chan struct{}, 1)
	g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "proj", Handler: func(context.Context, domain.EventEnvelope[any]) error {
		handled.Add(1)
		probesAtHandling <- prober.started.Load()
		return nil
	}, Options: []subscriptions.SubscriberOption{subscriptions.WithPollInterval(poll)}}},
		subscriptions.WithGroupWorkers(1), subscriptions.WithGroupPollInterval(poll), subscriptions.WithGroupWakeSignal("", wake),
		subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	require.NoError(t, g.Add(gt.feed))
	prober.armed.Store(true) // the first poll interval's checkpoint statement is held
	runGroup(t, g)
	select {
	case <-prober.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no checkpoint probe")
	}
	appendN(t, gt.feed.Events, "E", 0, 1)
	wake <- struct{}{}
	// The wake's probe has run (and skipped the database) once the wake
	// is taken; the statement then returns.
	require.Eventually(t, func() bool { return len(wake) == 0 }, 30*time.Second, time.Millisecond)
	close(prober.release)
	var at int32
	select {
	case at = <-probesAtHandling:
	case <-time.After(30 * time.Second):
		t.Fatal("the woken event was not handled")
	}
	require.EqualValues(t, 1, at, "the woken event waited for the next poll interval's probe")
	require.EqualValues(t, 1, handled.Load())
}
