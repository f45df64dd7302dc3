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
	inner := make([]subscriptions.CheckpointStore, len(stores))
	for i, s := range stores {
		inner[i] = s.(refusingProber).MemoryCheckpointStore
	}
	return r.MemoryCheckpointStore.ProbeCheckpoints(ctx, inner, names)
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
	hung          *atomic.Int32
}

func (h hangingProber) ProbeCheckpoints(ctx context.Context, stores []subscriptions.CheckpointStore, names []string) ([][]subscriptions.CheckpointProbe, error) {
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
	inner := make([]subscriptions.CheckpointStore, len(stores))
	for i, s := range stores {
		inner[i] = s.(hangingProber).MemoryCheckpointStore
	}
	return h.MemoryCheckpointStore.ProbeCheckpoints(ctx, inner, names)
}

// TestGroupSlowCheckpointProbeKeepsDatabaseUp makes the checkpoint probe
// of a tenant's database hang for several poll intervals, after its heads
// were read: the database answered, so it is not put down (it was, when
// the probe waited for both reads: a slow checkpoint statement held the
// tenants of a healthy database), no second checkpoint probe starts
// meanwhile, and events appended during the hang are handled once it
// ends.
func TestGroupSlowCheckpointProbeKeepsDatabaseUp(t *testing.T) {
	t.Parallel()
	prober := hangingProber{subscriptions.NewMemoryCheckpointStore(), make(chan struct{}), make(chan struct{}), &atomic.Int32{}}
	names := map[string]string{"proj": ""}
	gt, ledger, logs := runProbedMemoryTenant(t, "hanging", prober, names, 2)
	close(prober.hang)
	require.Eventually(t, func() bool { return prober.hung.Load() > 0 }, 30*time.Second, time.Millisecond, "the checkpoint probe hangs")
	appendN(t, gt.feed.Events, "During", 2, 3)
	require.Never(t, func() bool { return strings.Contains(logs.String(), "takes longer than the poll interval") }, 5*groupPoll, groupPoll/4,
		"a database whose heads answered was put down for its checkpoint statement")
	require.EqualValues(t, 1, prober.hung.Load(), "no second checkpoint probe while the first hangs")
	close(prober.release)
	ledger.waitCalls(t, 5)
	ledger.requireOnce(t, []*groupTenant{gt}, names)
	require.NotContains(t, logs.String(), "takes longer than the poll interval")
}
