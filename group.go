package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ident"
)

// DefaultGroupWorkers is how many batch cycles a Group runs at once when
// WithGroupWorkers is not supplied.
const DefaultGroupWorkers = 4

var (
	// ErrTenantExists is returned by Group.Add for a tenant the group
	// already has (or is still removing).
	ErrTenantExists = errors.New("the group already has this tenant")

	// ErrUnknownTenant is returned by Group.Remove, Group.Subscriber and
	// Group.Status for a tenant the group does not have.
	ErrUnknownTenant = errors.New("the group has no such tenant")
)

// GroupSubscriber is one subscriber definition of a Group: the group runs
// it, under Name, for every tenant, as NewSubscriber(Name, the tenant's
// event store, its checkpoint store, Handler, Options...) would.
//
// Options are any SubscriberOption but those the group provides, which
// NewGroup refuses: WithWakeSignal (the group wakes its tenants itself,
// see WithGroupWakeSignal) and WithParkingLot (a lot is a tenant's:
// Feed.Parking). A definition WithPartitions(n) runs each tenant's n
// partitions as the group's own units, each one batch cycle at a time on
// the group's workers, at most WithConcurrency(k) (default 1) of one
// tenant at once in this process; see Group. WithFirstRunCatchUp's mark is recorded by each tenant's first cycle of
// the name in a Run. WithPollInterval is the delay before a tenant's
// name is tried again after a failure, or while another process holds its
// checkpoint; the group's own probe interval is WithGroupPollInterval.
type GroupSubscriber struct {
	Name    string
	Handler Handler
	Options []SubscriberOption
}

// Feed is one tenant of a Group: a database, or a schema of one, with its
// event store and checkpoint store (and, optionally, its parking lot,
// given to every definition as WithParkingLot).
//
// Database names the database the tenant's stores are on: the tenants of
// one Database share one head probe per poll interval (HeadProber) and
// one wake signal (WithGroupWakeSignal). Give the same name to every
// tenant of one database (for schemas selected by search_path, the server
// and database of their DSN) and different names to different databases;
// "" makes the tenant a database of its own (a SQLite file, a memory
// store).
type Feed struct {
	Tenant      string
	Database    string
	Events      domain.EventStore
	Checkpoints CheckpointStore
	Parking     ParkingLot
}

// HeadProber is the optional capability of an EventStore that reads the
// feed heads of many event stores of its kind on its database in one
// statement (infrastructure.GormEventStore and pgxstore.EventStore on
// Postgres have it). A Group probes each database's tenants through the
// first tenant's store of the database: one statement per poll interval,
// on one connection, however many tenants there are, instead of one poll
// per tenant and subscriber name.
//
// ProbeHeads returns, in order, what each of stores' HeadPosition would
// return. A store it cannot read that way is an error wrapping
// errors.ErrUnsupported: the group then reads each of the database's
// tenants' heads on its own (HeadPosition) at every probe, as it does for
// an event store without the capability, and logs that once.
type HeadProber interface {
	ProbeHeads(ctx context.Context, stores []domain.EventStore) ([]int64, error)
}

// tenantKey is the context key of the tenant a Group's handler runs for.
type tenantKey struct{}

// TenantFromContext returns the tenant (Feed.Tenant) a Group's handler
// runs for, from the handler's context (also in ReplayParked of a group's
// Subscriber); "" outside one. The batch transaction (TxFromContext) is
// already the tenant's: this is for what the handler does elsewhere.
func TenantFromContext(ctx context.Context) string {
	tenant, _ := ctx.Value(tenantKey{}).(string)
	return tenant
}

// withTenant returns ctx carrying tenant, for TenantFromContext; ctx
// itself when tenant is "".
func withTenant(ctx context.Context, tenant string) context.Context {
	if tenant == "" {
		return ctx
	}
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// GroupOption configures a Group; NewGroup validates the result.
type GroupOption func(*groupConfig)

type groupConfig struct {
	workers      int
	pollInterval time.Duration
	logger       *slog.Logger
	wakes        []groupWake
}

// groupWake is one WithGroupWakeSignal.
type groupWake struct {
	database string
	wake     <-chan struct{}
}

// WithGroupWorkers sets how many batch cycles the group runs at once
// (default DefaultGroupWorkers), whatever the number of tenants: the
// group's share of the connection budget (see Group). n <= 0 is rejected.
func WithGroupWorkers(n int) GroupOption {
	return func(c *groupConfig) { c.workers = n }
}

// WithGroupPollInterval sets how often the group probes every database for
// tenants whose feed head moved (default DefaultPollInterval): the longest
// an event waits without a wake signal, and the time a process takes to
// notice a tenant's events that another, stopped, process left. d <= 0 is
// rejected.
func WithGroupPollInterval(d time.Duration) GroupOption {
	return func(c *groupConfig) { c.pollInterval = d }
}

// WithGroupLogger sets the logger of the group and, unless a definition
// gives its own (WithLogger), of its subscribers; their lines carry the
// tenant. nil means slog.Default().
func WithGroupLogger(logger *slog.Logger) GroupOption {
	return func(c *groupConfig) { c.logger = logger }
}

// WithGroupWakeSignal makes a signal on wake probe the tenants of database
// (Feed.Database) at once instead of at the next poll interval; database
// "" probes every database. Pass one channel per source:
// PostgresListener.Subscribe() of a listener on the database (the tenants'
// stores NOTIFY on the listener's channel: one LISTEN connection serves
// every schema of the database, see infrastructure.WithNotifyChannel), or
// InProcessNotifier.Subscribe() for stores wrapped in a
// NotifyingEventStore. The probe finds which tenants moved, so a signal
// costs one statement per database, not one per tenant. A closed channel
// is logged and dropped (the group polls).
func WithGroupWakeSignal(database string, wake <-chan struct{}) GroupOption {
	return func(c *groupConfig) { c.wakes = append(c.wakes, groupWake{database: database, wake: wake}) }
}

// Group runs a set of subscriber definitions over many feeds, the
// tenants: each tenant's event store and checkpoint store, one database
// or one schema each, which the application adds and removes while the
// group runs. Every (tenant, definition) pair is a Subscriber of its own,
// whose checkpoint coordinates across processes exactly as a standalone
// Subscriber's does, through the same batch cycle: N processes running
// the same group over the same tenants share their work without a
// leader, never handle an event twice where the handler writes through
// the batch transaction, and a process that stops hands its tenants over
// within the poll interval.
//
// # A bounded budget
//
// A fixed pool of workers (WithGroupWorkers) runs the tenants' batch
// cycles from a ready queue, one cycle at a time each, round robin: a
// tenant's name is ready when the probe finds its feed head moved, when
// its last cycle found more work, when its checkpoint is reset or resumed
// through its Subscriber, and again a poll interval after a failure or
// while another process holds its checkpoint, or once a failing event's
// retry backoff is over. A caught-up tenant is not
// polled at all: once per poll interval (and on every wake signal) the
// group reads the feed heads of all the tenants of a database in one
// statement (HeadProber), and only a tenant whose head moved runs again.
// Without the capability (SQLite, memory, or stores of mixed kinds) the
// group reads each idle tenant's head (HeadPosition) at every probe
// instead, one statement per tenant and poll interval. Once per poll
// interval the group also reads the checkpoints and pauses of the
// database's tenants in one more statement (CheckpointProber, which this
// package's stores and pgxstore's have), so that a reset, pause or resume
// made elsewhere (another process, the command line) on an idle tenant is
// noticed within the interval; a paused name is then not polled either.
// Without the capability such a change waits for the tenant's next event.
//
// A partitioned definition (WithPartitions) is a unit per partition of
// each tenant, plus one that scans the tenant's feed: when the probe finds
// the head moved, the scan reads the new events in one statement (two on
// a backlog of more than a thousand) and only the partitions that got
// some run; at most WithConcurrency of them (1 by
// default) at once per tenant in this process, and every partition's
// checkpoint coordinates across processes as a standalone partitioned
// Subscriber's does. The scan's first cycle of a Run checks the tenant's
// partition count (and seeds the partitions on first use, from the
// name's plain checkpoint if it has one): a tenant whose name has
// checkpoints for another count has that definition stopped, as any
// fatal misconfiguration (see Run), the others running on; so has one
// repartitioned elsewhere while the group runs, at its next batch or
// checkpoint probe.
//
// The connections a process running a Group uses at once are at most
//
//	workers + 1 (the probe: one statement at a time, but for a database
//	whose probe hangs, below) + listeners (one LISTEN connection per
//	database given a PostgresListener, outside the pools) + the
//	application's appends and operator calls at once (Status, Lag,
//	ResetCheckpoint...: one each, see Connections in the package
//	documentation)
//
// whatever the number of tenants, and on each server no more than that,
// since every batch cycle holds at most one connection (the Connections
// rule), a partition's as any other. The
// tenants of one database share one pool when their stores name their
// schema (WithSchema here and in infrastructure and pgxstore): size it to
// the budget, whatever the number of tenants. Stores that select their
// schema through their pool's search_path need a pool per schema, each
// keeping up to its SetMaxIdleConns after use; open those with
// SetMaxIdleConns(0) for idle tenants to hold no connection.
//
// # Databases that go down
//
// Tenants may be on different servers (one Database each). A database
// whose head probe fails, or is still running after a poll interval, is
// down (a checkpoint probe is given a poll interval, at least a second,
// and does not put a database down):
// its tenants start no cycle (they wait, holding no worker) until a probe
// reaches it again, then resume on their own; a down database costs one
// probe statement per poll interval, and a probe that hangs is not
// repeated until it returns, so that each database has one probe
// statement at a time. The probe waits for one database at most a poll
// interval before it goes on to the next. With tenants on more than one
// database (and more than one worker), one database runs at most
// workers - 1 cycles at once: cycles
// whose statements hang rather than fail (a server gone behind a
// PgBouncer, which queues them up to its query_wait_timeout; a network
// that drops packets: set connect_timeout) then hold at most that many
// workers until the driver gives up, and the other databases' tenants go
// on with the rest. A second database that hangs while the first's
// cycles still do can take the last worker.
//
// # Poison events
//
// A failing event's retry backoff (WithRetryBackoff) holds no worker: its
// cycle ends there and the group runs the next attempt once the backoff
// is over, or at once after a reset or resume (through the tenant's
// Subscriber, or elsewhere, read by the checkpoint probe); Remove ends it.
//
// A Group's methods are safe for concurrent use. Run runs one at a time;
// Add and Remove may be called before, during and after it.
type Group struct {
	defs    []GroupSubscriber
	cfg     groupConfig
	running atomic.Bool

	// mu guards tenants, order, run and every tenant's and unit's run
	// state (groupTenant, groupUnit).
	mu      sync.Mutex
	tenants map[string]*groupTenant
	order   []*groupTenant // in the order of Add: the probe's order
	run     *groupRun      // the Run in progress; nil otherwise
	// unprobed records the databases whose prober refused
	// (errors.ErrUnsupported), logged once; unprobedCheckpoints those whose
	// CheckpointProber did. Guarded by mu.
	unprobed, unprobedCheckpoints map[string]bool
	// probeNames are the checkpoint rows the checkpoint probe reads of
	// every tenant, one per unit in the order of groupTenant.units: a
	// definition's name, or a partitioned one's count row (its scan unit)
	// and partitions. Fixed by NewGroup.
	probeNames []string
}

// NewGroup returns a group of the definitions defs, with no tenant yet.
// Every definition is checked as NewSubscriber checks it (an error names
// the definition and the argument or option), names must be distinct, and
// options the group does not take (see GroupSubscriber) are refused.
func NewGroup(defs []GroupSubscriber, opts ...GroupOption) (*Group, error) {
	g := &Group{
		defs:     slices.Clone(defs),
		cfg:      groupConfig{workers: DefaultGroupWorkers, pollInterval: DefaultPollInterval},
		tenants:  make(map[string]*groupTenant),
		unprobed: make(map[string]bool),

		unprobedCheckpoints: make(map[string]bool),
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&g.cfg)
		}
	}
	switch {
	case g.cfg.workers <= 0:
		return nil, fmt.Errorf("subscriptions: NewGroup: workers %d must be positive (WithGroupWorkers)", g.cfg.workers)
	case g.cfg.pollInterval <= 0:
		return nil, fmt.Errorf("subscriptions: NewGroup: poll interval %v must be positive (WithGroupPollInterval)", g.cfg.pollInterval)
	case len(defs) == 0:
		return nil, errors.New("subscriptions: NewGroup: no subscriber definition")
	}
	if isNil(g.cfg.logger) {
		g.cfg.logger = slog.Default()
	}
	for i, w := range g.cfg.wakes {
		if w.wake == nil {
			return nil, fmt.Errorf("subscriptions: NewGroup: WithGroupWakeSignal %d (database %q): nil channel", i, w.database)
		}
	}
	names := make(map[string]bool, len(defs))
	for _, def := range g.defs {
		if names[def.Name] {
			return nil, fmt.Errorf("subscriptions: NewGroup: subscriber %q defined twice", def.Name)
		}
		names[def.Name] = true
		s, err := g.checkDef(def)
		if err != nil {
			return nil, fmt.Errorf("subscriptions: NewGroup: subscriber %q: %w", def.Name, err)
		}
		if s.partitions == 0 {
			g.probeNames = append(g.probeNames, s.name)
		} else {
			g.probeNames = append(append(g.probeNames, partitionMarker(s.name)), s.partitionNames()...)
		}
	}
	return g, nil
}

// checkDef refuses the options a group provides or does not run, then
// builds the definition once on memory stores, so that every other
// mistake is reported here rather than at Add; it returns that build.
func (g *Group) checkDef(def GroupSubscriber) (*Subscriber, error) {
	scratch := &Subscriber{config: &config{}}
	for _, opt := range def.Options {
		if opt != nil {
			opt(scratch)
		}
	}
	switch {
	case scratch.wake != nil:
		return nil, errors.New("WithWakeSignal: the group wakes its tenants (WithGroupWakeSignal)")
	case scratch.parking != nil:
		return nil, errors.New("WithParkingLot: a parking lot is a tenant's (Feed.Parking)")
	}
	return g.newSubscriber(def, checkFeed())
}

// newSubscriber builds def's Subscriber for feed.
func (g *Group) newSubscriber(def GroupSubscriber, feed Feed) (*Subscriber, error) {
	opts := make([]SubscriberOption, 0, len(def.Options)+3)
	opts = append(opts, WithLogger(g.cfg.logger))
	opts = append(opts, def.Options...)
	if !isNil(feed.Parking) {
		opts = append(opts, WithParkingLot(feed.Parking))
	}
	opts = append(opts, func(s *Subscriber) { s.tenant = feed.Tenant })
	return NewSubscriber(def.Name, feed.Events, feed.Checkpoints, def.Handler, opts...)
}

// Add adds a tenant: once the group runs (at once, if it runs now), every
// definition runs over the tenant's feed. The tenant's name must be
// non-empty, at most MaxSubscriberNameBytes, valid UTF-8 and without NUL;
// a tenant the group has (or is still removing) is refused with
// ErrTenantExists; every definition's Subscriber is built for the feed as
// NewSubscriber builds it, and its error is returned (naming tenant and
// definition). Add does no I/O.
//
// The tenant's Subscribers are the group's to run: their Run and
// DeleteState return ErrRunning until the tenant is removed. Their other
// methods (Group.Subscriber) work as a standalone Subscriber's.
func (g *Group) Add(feed Feed) error {
	if err := ident.Check("tenant", feed.Tenant); err != nil {
		return fmt.Errorf("subscriptions: group: add tenant: %w", err)
	}
	t := &groupTenant{feed: feed, key: feed.Database, seen: -1}
	if t.key == "" {
		t.key = "\x00" + feed.Tenant // a database of its own
	}
	for _, def := range g.defs {
		s, err := g.newSubscriber(def, feed)
		if err != nil {
			return fmt.Errorf("subscriptions: group: add tenant %q: %w", feed.Tenant, err)
		}
		s.running.Store(true) // the group's: see Add
		t.subs = append(t.subs, s)
		u := &groupUnit{t: t, s: s}
		t.units = append(t.units, u)
		if s.partitions == 0 {
			s.afterReset = func() { g.resetWoken(u) }
			continue
		}
		// A partitioned definition: u scans the tenant's feed for the
		// partitions, which are units of their own (see groupParts).
		ps := &groupParts{parent: s, scan: u, limit: max(s.concurrency, 1)}
		u.parts = ps
		for range s.partitions {
			pu := &groupUnit{t: t, parts: ps}
			ps.units = append(ps.units, pu)
			t.units = append(t.units, pu)
		}
		s.afterReset = func() { g.resetWoken(u) }
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tenants[feed.Tenant] != nil {
		return fmt.Errorf("subscriptions: group: add tenant %q: %w", feed.Tenant, ErrTenantExists)
	}
	g.tenants[feed.Tenant] = t
	g.order = append(g.order, t)
	if g.run != nil {
		g.startTenant(g.run, t)
	}
	g.cfg.logger.Debug("group: tenant added", "tenant", feed.Tenant, "database", feed.Database)
	return nil
}

// Remove removes a tenant: its batches in flight drain (commit or roll
// back, as on Run's shutdown, bounded by WithShutdownGrace), nothing of it
// runs any more, and Remove returns once that is so. If ctx ends first,
// Remove returns its error and the tenant goes on draining and is removed
// once it has stopped (Add refuses it meanwhile). An unknown tenant is an
// error wrapping ErrUnknownTenant. The tenant's checkpoints stay as they
// are: another process running it goes on, and adding it again resumes.
func (g *Group) Remove(ctx context.Context, tenant string) error {
	g.mu.Lock()
	t := g.tenants[tenant]
	if t == nil {
		g.mu.Unlock()
		return fmt.Errorf("subscriptions: group: remove tenant %q: %w", tenant, ErrUnknownTenant)
	}
	if t.done == nil {
		t.done = make(chan struct{})
		t.removing = true
		if t.live == 0 {
			g.removed(t)
		} else {
			t.cancel()
			for _, u := range t.units {
				if u.state != unitRunning {
					g.end(u)
				}
			}
		}
	}
	done := t.done
	g.mu.Unlock()
	select {
	case <-done:
		g.cfg.logger.Debug("group: tenant removed", "tenant", tenant)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("subscriptions: group: remove tenant %q: its batch in flight still drains: %w", tenant, ctx.Err())
	}
}

// Tenants returns the group's tenants in the order they were added
// (those being removed included).
func (g *Group) Tenants() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, len(g.order))
	for i, t := range g.order {
		out[i] = t.feed.Tenant
	}
	return out
}

// Subscriber returns the Subscriber the group runs for tenant and the
// definition name: for Lag, Status, Healthy, ResetCheckpoint, ListParked,
// ReplayParked, Pause and the other per-name calls (not Run, which the
// group runs). An unknown tenant wraps ErrUnknownTenant; an unknown name
// is an error too.
func (g *Group) Subscriber(tenant, name string) (*Subscriber, error) {
	g.mu.Lock()
	t := g.tenants[tenant]
	g.mu.Unlock()
	if t == nil {
		return nil, fmt.Errorf("subscriptions: group: tenant %q: %w", tenant, ErrUnknownTenant)
	}
	for _, s := range t.subs {
		if s.name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("subscriptions: group: tenant %q: no subscriber named %q", tenant, name)
}

// Status returns one Status per tenant and definition (Status.Tenant
// names the tenant), ordered by tenant in the order they were added and
// then by definition; with tenants given, those tenants' only (an unknown
// one wraps ErrUnknownTenant). It reads each row as Subscriber.Status
// does, one after another (one connection at a time): a row that fails is
// left out (but for a checkpoint ahead of the head, which Subscriber.Status
// returns with its row) and its error, naming tenant and subscriber,
// joined into the returned error beside the rows that were read.
func (g *Group) Status(ctx context.Context, tenants ...string) ([]Status, error) {
	g.mu.Lock()
	var list []*groupTenant
	var errs []error
	if len(tenants) == 0 {
		list = slices.Clone(g.order)
	}
	for _, name := range tenants {
		if t := g.tenants[name]; t != nil {
			list = append(list, t)
		} else {
			errs = append(errs, fmt.Errorf("subscriptions: group status: tenant %q: %w", name, ErrUnknownTenant))
		}
	}
	g.mu.Unlock()
	out := make([]Status, 0, len(list)*len(g.defs))
	for _, t := range list {
		for _, s := range t.subs {
			st, err := s.Status(ctx)
			if err != nil {
				errs = append(errs, fmt.Errorf("tenant %q: %w", t.feed.Tenant, err))
				if !errors.Is(err, ErrCheckpointAhead) { // a row all the same, as Subscriber.Status
					continue
				}
			}
			out = append(out, st)
		}
	}
	return out, errors.Join(errs...)
}
