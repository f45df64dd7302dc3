package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// probeChunk bounds the stores one ProbeHeads statement reads: a database
// with more tenants is probed in several statements, one after another.
const probeChunk = 256

// unitState is where a groupUnit stands in its group's Run.
type unitState int

const (
	// unitEnded: not started in this Run, or ended (stopped, fatal,
	// removed); nothing schedules it.
	unitEnded unitState = iota
	// unitQueued: in the ready queue.
	unitQueued
	// unitRunning: a worker runs its cycle.
	unitRunning
	// unitWaiting: its timer will queue it (a failure, or another process
	// holds the checkpoint).
	unitWaiting
	// unitDormant: caught up; only a probe that finds its head moved, or
	// a reset, queues it.
	unitDormant
	// unitHeld: its database does not answer (groupDB.down); the probe
	// that reaches it again queues it.
	unitHeld
)

// groupDB is one database's state in a Run (the tenants of one
// Feed.Database, or a tenant of its own), guarded by the group's mu.
type groupDB struct {
	// live counts its tenants started in this Run and not ended.
	live int
	// running counts its units' cycles running now (workerLimit bounds
	// it).
	running int
	// probing: a probe of it is in flight; probes skip it meanwhile, so
	// that it has one probe statement at a time however long one takes.
	// rewake: a wake-up's probe skipped it meanwhile; probeDB asks for
	// another once the probe in flight returns.
	probing, rewake bool
	// down: its last probe failed, or ran past a poll interval; no unit
	// of it starts a cycle (they are held) until a probe reaches it.
	down bool
	// downErr is the failure that put it down, logged once; nil when the
	// probe overran.
	downErr error
	held    []*groupUnit
	// pick counts its probes: the tenant a probe of it reads while it is
	// down, in turn (readHeads).
	pick int
}

// groupTenant is one Feed of a Group. Its run fields are guarded by the
// group's mu.
type groupTenant struct {
	feed Feed
	// key groups the tenants probed together: Feed.Database, or the
	// tenant's own key when it has none.
	key string
	// subs are the tenant's Subscribers, one per definition in order:
	// what Group.Subscriber and Group.Status answer with.
	subs []*Subscriber
	// units are what the group schedules: a unit per definition, and for
	// a partitioned one its scan unit followed by its partitions' (the
	// order of Group.probeNames).
	units []*groupUnit

	// ctx is the tenant's context in the Run in progress, a child of the
	// Run's, cancelled by Remove; cancel cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// live counts the units started in this Run and not yet ended.
	live int
	// seen is the feed head the last probe read; -1 when none did.
	seen int64
	// removing is set by Remove; done is closed once the tenant is gone.
	removing bool
	done     chan struct{}
}

// groupUnit is one definition run over one tenant: a Subscriber and, in a
// Run, its runner. Its run fields are guarded by the group's mu; r is
// used only by the worker that holds the unit (unitRunning).
type groupUnit struct {
	t *groupTenant
	// s is the unit's Subscriber: the definition's, or for a partition
	// the partition's (Subscriber.partitionChild, made by startTenant for
	// each Run).
	s *Subscriber
	// parts is the partitioned definition the unit belongs to (its scan
	// unit, or one of its partitions); nil for an unpartitioned one.
	parts *groupParts
	// skipDelay is a partition's wait after another process held its
	// checkpoint: doubled from partitionSkipRetry up to the poll interval
	// while that goes on, so that the group's idle workers pick up a
	// partition another process released between its batches, as a
	// standalone partitioned Run's do (partitionState.skipDelay).
	skipDelay time.Duration

	r         *runner
	stopDrain func()
	unobserve func()
	state     unitState
	// check is the next cycle's: read the checkpoint before the feed.
	check bool
	// woken is when the wake-up that queued the unit was seen (the wake
	// latency metric); zero for other causes.
	woken time.Time
	// dirty: woken while running; queued again once its cycle ends.
	// recheck: reset while running; the next cycle reads the checkpoint.
	dirty, recheck bool
	// wakeable: the unit's wait may be cut short by a wake-up (not after
	// a failure, which waits out the poll interval, as Run does).
	// backoff: the wait is a failing event's retry backoff
	// (outcomeBackoff), which a reset or a resume cuts short.
	wakeable, backoff bool
	timer             *time.Timer
	// at is the checkpoint the unit last knew while it waits or is
	// dormant (-1 when none), and paused what the last checkpoint probe
	// read of its pause: a probe that reads another position, or a
	// resume, runs it (noticeCheckpoint).
	at     int64
	paused bool
	// catchUp: WithFirstRunCatchUp's mark is still to be recorded in this
	// Run (by the unit's worker: see cycle).
	catchUp bool
}

// groupParts is a partitioned definition run over one tenant: the work of
// a standalone partitioned Run's coordinator and workers, as units of the
// group. The scan unit (scan, whose Subscriber is the definition's) is
// woken by the probe when the tenant's head moves, as any unit is; its
// cycle reads the feed past scanned in one statement and wakes the
// partitions that got events, and only those run (a partition's unit is
// the ordinary unit over the partition's view of the feed). Its first
// cycle in a Run does what a partitioned Run does before its loop: reads
// the head (where the scans start), checks the partition count and seeds
// the partitions (initPartitions), reads their checkpoints, and then
// queues every partition; until then no partition runs (ready). A reset
// or resume of the definition queues the scan reading the checkpoints
// (check), which then queues every partition reading its own. Its fields
// are guarded by the group's mu, but for those the scan's worker owns
// while it runs (scanned, found).
type groupParts struct {
	parent *Subscriber
	scan   *groupUnit
	units  []*groupUnit
	// limit is WithConcurrency (1 when not given): how many of the
	// partitions run at once in this process; running counts them.
	limit, running int
	// ready: the first scan of the Run is done; until then the
	// partitions are not woken.
	ready bool
	// failed: a fatal error ended the definition for the tenant in this
	// Run; every unit of it ends (one running ends after its cycle).
	failed bool
	// index is the partitions' shared feed index in this Run (nil when
	// the store is not a FeedIndex); stopDrain ends their drain context
	// (one for the definition's units) once live, the units not ended, is
	// 0.
	index     *partitionIndex
	stopDrain func()
	live      int
	// offset is where this process starts waking every partition (a
	// random one per Run, as a standalone Run starts), so that the
	// processes sharing the tenant seldom collide.
	offset int
	// scanned is where the next scan starts; woken is when the wake-up
	// that queued the scan was seen; found and foundAll are what the scan
	// just run found (the partitions to wake, or all), with check for
	// a scan that read the checkpoints. Owned by the scan's worker while
	// it runs; read by after.
	scanned    int64
	woken      time.Time
	found      []int
	foundAll   bool
	foundCheck bool
	// nowReady: the scan's first cycle is done (afterScan sets ready);
	// fatal is the scan's fatal error; positions are the partitions'
	// checkpoints the scan read (nil when it read none), which afterScan
	// hands to their runners under mu. Owned like found.
	nowReady  bool
	fatal     error
	positions []int64
}

// isPartition reports whether u runs a partition (not a definition, nor
// a partitioned definition's scan).
func (u *groupUnit) isPartition() bool { return u.parts != nil && u.parts.scan != u }

// groupRun is one Run's state, guarded by the group's mu.
type groupRun struct {
	ctx    context.Context
	cancel context.CancelFunc
	// ready is the queue the workers take units from; cond signals it.
	ready []*groupUnit
	cond  *sync.Cond
	// timers counts the unit timers that may still fire.
	timers sync.WaitGroup
	// wakeAll and wakeDBs are the probes the wake signals asked for;
	// wakeReq tells the probe loop.
	wakeAll bool
	wakeDBs map[string]bool
	wakeReq chan struct{}
	// panicked is the first handler panic a worker recovered; Run panics
	// with it once everything stopped.
	panicked any
	// dbs is every database's state, by groupTenant.key; liveDBs counts
	// those with a live tenant.
	dbs     map[string]*groupDB
	liveDBs int
	// probes counts the probe goroutines still running.
	probes sync.WaitGroup
}

// db returns the state of the database key, created on first use.
// Called with mu held.
func (run *groupRun) db(key string) *groupDB {
	d := run.dbs[key]
	if d == nil {
		d = &groupDB{}
		run.dbs[key] = d
	}
	return d
}

// Run runs every tenant's definitions until ctx is cancelled, and returns
// nil once every goroutine it started has ended: the batches in flight
// drain first, as a Subscriber's Run drains its own (WithShutdownGrace
// bounds that). A second Run while one runs returns an error wrapping
// ErrRunning. Nothing of one tenant stops another: a tenant's fatal
// misconfiguration (an event store without a global ordered feed, a
// partition count that changed) stops that name of that tenant, is logged
// and shown by its Status (stopped, with the error). A panicking handler
// rolls its batch back and stops the group: Run panics with its value
// once the other workers have drained.
func (g *Group) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return fmt.Errorf("subscriptions: group run: %w", ErrRunning)
	}
	defer g.running.Store(false)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	run := &groupRun{ctx: runCtx, cancel: cancel, cond: sync.NewCond(&g.mu), wakeDBs: map[string]bool{}, wakeReq: make(chan struct{}, 1),
		dbs: map[string]*groupDB{}}
	g.mu.Lock()
	g.run = run
	for _, t := range g.order {
		if !t.removing {
			g.startTenant(run, t)
		}
	}
	g.mu.Unlock()
	g.cfg.logger.Info("group started", "workers", g.cfg.workers, "poll_interval", g.cfg.pollInterval, "subscribers", len(g.defs))

	var wg sync.WaitGroup
	for range g.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.work(run)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.probeLoop(run)
	}()
	for _, w := range g.cfg.wakes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.forwardWake(run, w)
		}()
	}

	<-runCtx.Done()
	g.mu.Lock()
	run.cond.Broadcast()
	g.mu.Unlock()
	wg.Wait()
	g.mu.Lock()
	for _, t := range g.order {
		for _, u := range t.units {
			if u.state != unitEnded {
				g.end(u)
			}
		}
	}
	g.run = nil
	g.mu.Unlock()
	run.timers.Wait()
	run.probes.Wait() // on the cancelled context: each returns promptly
	g.cfg.logger.Info("group stopped")
	if run.panicked != nil {
		panic(run.panicked)
	}
	return nil
}

// startTenant starts t's units in run, each queued with its checkpoint to
// read, but for a partitioned definition's partitions, which its scan
// queues (startPartition). Called with mu held.
func (g *Group) startTenant(run *groupRun, t *groupTenant) {
	t.ctx, t.cancel = context.WithCancel(withTenant(run.ctx, t.feed.Tenant))
	t.seen = -1
	if db := run.db(t.key); db.live == 0 {
		run.liveDBs++
		db.live = 1
	} else {
		db.live++
	}
	for _, u := range t.units {
		u.check, u.dirty, u.recheck, u.woken = true, false, false, time.Time{}
		u.at, u.paused, u.catchUp = -1, false, false
		t.live++
		if u.isPartition() {
			g.startPartition(u)
			continue
		}
		u.s.tel.started()
		u.unobserve = u.s.tel.observe(u.s)
		u.catchUp = u.s.firstRunCatchUp
		if ps := u.parts; ps != nil {
			// The scan: it holds no checkpoint, and so no runner.
			ps.index = u.s.newPartitionIndex(nil)
			ps.ready, ps.failed, ps.running, ps.live, ps.scanned = false, false, 0, 1+len(ps.units), -1
			ps.found, ps.foundAll, ps.foundCheck, ps.fatal, ps.positions = nil, false, false, nil, nil
			ps.offset = rand.IntN(len(ps.units))
			drain, stop := u.s.drainContext(t.ctx)
			ps.stopDrain, u.stopDrain, u.r = stop, nil, nil
			tels := u.s.tel.partitions(len(ps.units))
			names := u.s.partitionNames()
			for p, pu := range ps.units {
				pu.s = u.s.partitionChild(names[p], p, ps.index, tels[p])
				pu.r = newRunner(pu.s, nil, drain)
			}
		} else {
			drain, stop := u.s.drainContext(t.ctx)
			u.r = newRunner(u.s, nil, drain)
			u.r.deferBackoff = true // a backoff holds no worker: see after
			u.stopDrain = stop
		}
		g.enqueue(run, u)
	}
}

// startPartition readies the partition unit u for the Run its scan was
// just started in (startTenant made its Subscriber and runner): dormant
// until the scan's first cycle queues it. Called with mu held.
func (g *Group) startPartition(u *groupUnit) {
	u.r.deferBackoff = true
	u.r.countChecked = true // the scan's first cycle checks the count
	u.unobserve = func() {} // the definition's gauges cover its partitions
	u.state, u.skipDelay = unitDormant, 0
}

// enqueue puts u at the back of the ready queue. Called with mu held.
func (g *Group) enqueue(run *groupRun, u *groupUnit) {
	g.stopTimer(run, u)
	u.state = unitQueued
	run.ready = append(run.ready, u)
	run.cond.Signal()
}

// stopTimer stops u's timer, if any. Called with mu held.
func (g *Group) stopTimer(run *groupRun, u *groupUnit) {
	if u.timer != nil {
		if u.timer.Stop() {
			run.timers.Done() // it will not fire
		}
		u.timer = nil
	}
}

// wait makes u wait d before its next cycle; wakeable says whether a
// wake-up may cut the wait short, backoff that it is a retry backoff,
// which a reset or a resume cuts short. Called with mu held.
func (g *Group) wait(run *groupRun, u *groupUnit, d time.Duration, wakeable, backoff bool) {
	g.stopTimer(run, u)
	u.state, u.wakeable, u.backoff = unitWaiting, wakeable, backoff
	run.timers.Add(1)
	var timer *time.Timer
	timer = time.AfterFunc(d, func() {
		defer run.timers.Done()
		g.mu.Lock()
		defer g.mu.Unlock()
		if u.timer == timer && u.state == unitWaiting && g.run == run {
			u.timer = nil // fired: nothing to stop
			g.enqueue(run, u)
		}
	})
	u.timer = timer // the callback waits for mu, held here
}

// end ends u in the Run in progress, and the tenant once its last unit
// ended while it is being removed. Called with mu held.
func (g *Group) end(u *groupUnit) {
	if u.state == unitEnded {
		return
	}
	if g.run != nil {
		g.stopTimer(g.run, u)
	}
	u.state = unitEnded
	if ps := u.parts; ps != nil {
		if ps.live--; ps.live == 0 {
			ps.stopDrain() // no unit of it drains any more
		}
	} else {
		u.stopDrain()
	}
	u.unobserve()
	u.s.tel.setState(StateStopped)
	u.r = nil
	t := u.t
	t.live--
	if t.live == 0 {
		t.cancel()
		if g.run != nil {
			db := g.run.db(t.key)
			if db.live--; db.live == 0 {
				g.run.liveDBs--
			}
		}
		if t.removing {
			g.removed(t)
		}
	}
}

// removed drops t from the group and closes its done channel: its
// Subscribers may be run on their own again. Called with mu held.
func (g *Group) removed(t *groupTenant) {
	delete(g.tenants, t.feed.Tenant)
	if i := indexOf(g.order, t); i >= 0 {
		g.order = append(g.order[:i], g.order[i+1:]...)
	}
	for _, s := range t.subs {
		s.running.Store(false)
	}
	close(t.done)
}

func indexOf(list []*groupTenant, t *groupTenant) int {
	for i, x := range list {
		if x == t {
			return i
		}
	}
	return -1
}

// wake queues u after a wake-up (its feed head moved: check false) or a
// reset (check true). Called with mu held.
func (g *Group) wake(run *groupRun, u *groupUnit, check bool, at time.Time) {
	if u.isPartition() && (!u.parts.ready || u.parts.failed) {
		return // the scan's first cycle queues it; or it ends
	}
	switch u.state {
	case unitDormant:
		u.check, u.woken = check, at
		g.enqueue(run, u)
	case unitWaiting:
		if u.wakeable { // as Run's wait: a wake-up reads after the known position
			u.check, u.woken = check, at
			g.enqueue(run, u)
		} else if check && u.backoff {
			// A reset or a resume ends a retry backoff: the due attempt
			// runs now, and finds the checkpoint moved if it was reset.
			u.check = true
			g.enqueue(run, u)
		} else if check {
			u.check = true
		}
	case unitQueued, unitHeld:
		if check {
			u.check = true
		}
	case unitRunning:
		u.dirty = true
		u.recheck = u.recheck || check
		if u.woken.IsZero() {
			u.woken = at
		}
	}
}

// resetWoken is a Subscriber's afterReset: its checkpoint was reset or
// resumed, so its unit runs again, reading the checkpoint first.
func (g *Group) resetWoken(u *groupUnit) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if run := g.run; run != nil && u.state != unitEnded {
		g.wake(run, u, true, time.Time{})
	}
}

// work is one worker: it runs the cycles of the units it takes from the
// ready queue until the Run ends.
func (g *Group) work(run *groupRun) {
	for {
		u, check := g.next(run)
		if u == nil {
			return
		}
		out, ok := g.cycle(run, u, check)
		if !ok {
			return // a handler panicked: the Run ends
		}
		g.after(run, u, out)
	}
}

// next takes the first unit of the ready queue whose tenant still runs
// and whose database may start a cycle (workerLimit), and marks it
// running; nil once the Run ends. The units of a database that is down
// are held on the way.
func (g *Group) next(run *groupRun) (*groupUnit, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for run.ctx.Err() == nil {
		if u := g.take(run); u != nil {
			u.state = unitRunning
			if u.r != nil {
				u.r.wokenAt = u.woken
			} else {
				u.parts.woken = u.woken // a scan
			}
			u.woken = time.Time{}
			return u, u.check
		}
		run.cond.Wait()
	}
	return nil, false
}

// take removes from the ready queue, and returns, its first unit that may
// run now; nil if none. Called with mu held.
func (g *Group) take(run *groupRun) *groupUnit {
	limit := g.workerLimit(run)
	for i := 0; i < len(run.ready); i++ {
		u := run.ready[i]
		if u.state != unitQueued {
			run.ready = slices.Delete(run.ready, i, i+1) // ended while queued
			i--
			continue
		}
		if u.t.ctx.Err() != nil {
			run.ready = slices.Delete(run.ready, i, i+1)
			i--
			g.end(u)
			continue
		}
		db := run.db(u.t.key)
		if db.down {
			run.ready = slices.Delete(run.ready, i, i+1)
			i--
			u.state = unitHeld
			db.held = append(db.held, u)
			continue
		}
		if db.running >= limit {
			continue // another database's unit may run
		}
		if u.isPartition() && u.parts.running >= u.parts.limit {
			continue // WithConcurrency: another definition's unit may run
		}
		run.ready = slices.Delete(run.ready, i, i+1)
		db.running++
		if u.isPartition() {
			u.parts.running++
		}
		return u
	}
	return nil
}

// workerLimit is how many cycles of one database may run at once: every
// worker but one when the group's tenants are on several databases, so
// that a database whose statements hang instead of failing (a server gone
// behind a PgBouncer, a network that drops packets) cannot hold every
// worker while the other databases' tenants wait; every worker when
// there is one database. Called with mu held.
func (g *Group) workerLimit(run *groupRun) int {
	if run.liveDBs > 1 && g.cfg.workers > 1 {
		return g.cfg.workers - 1
	}
	return g.cfg.workers
}

// cycle runs one batch cycle of u: the run loop's own (runner.cycle), on
// the tenant's context. ok is false when the handler panicked: the panic
// is kept for Run, which ends.
func (g *Group) cycle(run *groupRun, u *groupUnit, check bool) (out outcome, ok bool) {
	defer func() {
		if v := recover(); v != nil {
			g.mu.Lock()
			if run.panicked == nil {
				run.panicked = v
			}
			g.end(u)
			g.mu.Unlock()
			run.cancel()
			ok = false
		}
	}()
	if u.catchUp {
		// WithFirstRunCatchUp: recorded before the tenant's name handles
		// anything, as Run records it before its loop; a failure is
		// retried after the poll interval, without a worker waiting.
		if err := u.s.recordCatchUp(u.t.ctx); err != nil {
			if u.t.ctx.Err() != nil {
				return outcomeStopped, true
			}
			u.s.logger.Error("subscriber: recording the first start's catch-up failed; will retry", "subscriber", u.s.name, "error", err)
			u.s.tel.fail("", nil, 0, err)
			return outcomeFailed, true
		}
		u.catchUp = false
	}
	if u.parts != nil && !u.isPartition() {
		return g.scanCycle(u.t.ctx, u.parts, check), true
	}
	return u.r.cycle(u.t.ctx, check || u.r.known < 0), true
}

// after schedules u by what its cycle came to, as Run's loop does.
func (g *Group) after(run *groupRun, u *groupUnit, out outcome) {
	s := u.s
	g.mu.Lock()
	defer g.mu.Unlock()
	run.db(u.t.key).running--
	run.cond.Signal() // a unit its database's limit kept queued may run
	if u.isPartition() {
		u.parts.running--
	}
	if ps := u.parts; ps != nil {
		if out == outcomeFatal {
			if u.isPartition() {
				g.failParts(run, ps, u.r.fatal)
			} else {
				g.failParts(run, ps, ps.fatal) // the scan's own: see groupParts
			}
		}
		if ps.failed {
			u.dirty, u.recheck = false, false
			g.end(u)
			return
		}
		if !u.isPartition() {
			g.afterScan(run, u, out)
			return
		}
	}
	dirty, recheck := u.dirty, u.recheck
	u.dirty, u.recheck = false, false
	if out != outcomeSkipped {
		u.skipDelay = 0
	}
	u.at = -1
	switch out {
	case outcomeIdle, outcomeSkipped:
		u.at = u.r.known
	case outcomeBackoff:
		u.at = u.r.retry.start
	}
	if u.t.ctx.Err() != nil && out != outcomeFatal {
		g.end(u) // removed, or the Run ends: the batch has drained
		return
	}
	switch out {
	case outcomeStopped:
		g.end(u)
		return
	case outcomeFatal:
		err := u.r.fatal
		s.logger.Error("group: subscriber cannot run for this tenant; it stops", "subscriber", s.name, "error", err)
		s.tel.fail("", nil, 0, err)
		g.end(u)
		return
	case outcomeMore:
		u.check = recheck
		g.enqueue(run, u)
	case outcomeIdle:
		s.tel.caughtUp()
		if dirty || recheck {
			u.check = recheck
			g.enqueue(run, u)
		} else {
			u.check, u.state = true, unitDormant
		}
	case outcomeSkipped:
		s.tel.setState(StateIdle)
		wait := s.pollInterval
		if u.isPartition() {
			u.skipDelay = min(max(2*u.skipDelay, partitionSkipRetry), s.pollInterval)
			wait = u.skipDelay
		}
		if dirty || recheck {
			u.check = recheck
			g.enqueue(run, u)
		} else {
			// A partition needs no read of its checkpoint first: the
			// batch's lock returns its position (runner.cycle).
			u.check = !u.isPartition()
			g.wait(run, u, wait, true, false)
		}
	case outcomeFailed:
		u.check = recheck
		g.wait(run, u, s.pollInterval, false, false)
	case outcomeBackoff:
		// The event's next attempt is due at r.retry.at: the unit waits
		// for it without a worker, so that poison events hold none.
		if recheck {
			u.check = true
			g.enqueue(run, u) // reset or resumed meanwhile: attempt now
		} else {
			g.wait(run, u, time.Until(u.r.retry.at), false, true)
		}
	}
}

// forwardWake turns the signals of one WithGroupWakeSignal channel into
// probe requests, until the Run ends.
func (g *Group) forwardWake(run *groupRun, w groupWake) {
	for {
		select {
		case <-run.ctx.Done():
			return
		case _, ok := <-w.wake:
			if !ok {
				g.cfg.logger.Warn("group: wake signal channel closed; the database is polled", "database", w.database, "poll_interval", g.cfg.pollInterval)
				return
			}
			g.mu.Lock()
			if w.database == "" {
				run.wakeAll = true
			} else {
				run.wakeDBs[w.database] = true
			}
			g.mu.Unlock()
			select {
			case run.wakeReq <- struct{}{}:
			default: // a request is pending: it covers this one
			}
		}
	}
}

// probeLoop probes every database once per poll interval, and the
// databases the wake signals name when they arrive, until the Run ends.
// A wake-up whose probe found no head moved is probed again after each of
// wakeRechecks, as Run re-checks after a wake: a notification can arrive
// before the commit it announces is visible to other sessions.
func (g *Group) probeLoop(run *groupRun) {
	ticker := time.NewTicker(g.cfg.pollInterval)
	defer ticker.Stop()
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	rechecks := -1 // the re-checks done since the last wake-up; -1: none due
	var recheckDBs map[string]bool
	for {
		select {
		case <-run.ctx.Done():
			return
		case <-ticker.C:
			g.probe(run, nil, true)
		case <-run.wakeReq:
			g.mu.Lock()
			all, dbs := run.wakeAll, run.wakeDBs
			run.wakeAll, run.wakeDBs = false, map[string]bool{}
			g.mu.Unlock()
			if all {
				dbs = nil
			}
			rechecks = -1
			recheck.Stop()
			if !g.probe(run, dbs, false) {
				rechecks, recheckDBs = 0, dbs
				recheck.Reset(wakeRechecks[0])
			}
		case <-recheck.C:
			if g.probe(run, recheckDBs, false) || rechecks+1 >= len(wakeRechecks) {
				rechecks = -1
				continue
			}
			rechecks++
			recheck.Reset(wakeRechecks[rechecks])
		}
	}
}

// probeSet is the tenants of one database a probe reads, in the order of
// Add.
type probeSet struct {
	key     string
	tenants []*groupTenant
}

// probe reads the feed heads of the databases in only (every database
// when nil), one database after another, and wakes the units of every
// tenant whose head moved since the last probe; moved reports one did.
//
// Each database's read runs on a goroutine of its own, which the probe
// waits for at most a poll interval: a database whose statements hang
// rather than fail (a server gone behind a PgBouncer, a network that
// drops packets) delays the others by that much once, is put down (its
// units are held: no worker waits on it) and is not probed again until
// that read returns. A database whose read fails is put down too, and its
// held units run again once a probe reaches it.
//
// With checkpoints (the poll interval's probe, not a wake-up's), a
// database that answers has its tenants' checkpoints probed too
// (readCheckpoints), so that a reset, pause or resume made elsewhere on an
// idle tenant is noticed; the probe does not wait for that read (probeDB).
func (g *Group) probe(run *groupRun, only map[string]bool, checkpoints bool) (moved bool) {
	g.mu.Lock()
	var sets []*probeSet
	byKey := map[string]*probeSet{}
	for _, t := range g.order {
		if t.removing || t.live == 0 {
			continue
		}
		if only != nil && !only[t.feed.Database] {
			continue
		}
		if db := run.db(t.key); db.probing {
			if !checkpoints {
				// A wake-up's probe: the read in flight may have read the
				// head before the event it announces; read it again once
				// that returns (probeDB).
				db.rewake = true
			}
			continue // its last read has not returned
		}
		set := byKey[t.key]
		if set == nil {
			set = &probeSet{key: t.key}
			byKey[t.key] = set
			sets = append(sets, set)
		}
		set.tenants = append(set.tenants, t)
	}
	for _, set := range sets {
		run.db(set.key).probing = true
	}
	g.mu.Unlock()
	for i, set := range sets {
		if run.ctx.Err() != nil {
			g.mu.Lock()
			for _, rest := range sets[i:] {
				run.db(rest.key).probing = false
			}
			g.mu.Unlock()
			return moved
		}
		heads, done := make(chan bool, 1), make(chan struct{})
		run.probes.Add(1)
		go func() {
			defer run.probes.Done()
			defer close(done)
			g.probeDB(run, set, checkpoints, heads)
		}()
		timer := time.NewTimer(g.cfg.pollInterval)
		select {
		case m := <-heads:
			moved = moved || m
			// The checkpoints next, within the same poll interval: the
			// database's heads answered, so a slow checkpoint statement
			// does not put it down, and the probe goes on to the next
			// database once the interval is over.
			select {
			case <-done:
			case <-timer.C:
			case <-run.ctx.Done():
			}
		case <-timer.C:
			g.overran(run, set)
		case <-run.ctx.Done():
		}
		timer.Stop()
	}
	return moved
}

// probeDB reads the heads of set's tenants and applies what it read
// (applyHeads), then sends on headsDone whether a head moved: the wake-ups
// just read do not wait for the checkpoints, and a database whose heads
// answered is not put down for a slow checkpoint statement. With
// checkpoints, on a database that answered, it then reads and applies the
// tenants' checkpoints, given a poll interval (at least a second); the
// database stays probing (no other probe of it starts) until that
// returns. A wake-up's probe that skipped the database meanwhile is
// probed again then (groupDB.rewake).
func (g *Group) probeDB(run *groupRun, set *probeSet, checkpoints bool, headsDone chan<- bool) {
	g.mu.Lock()
	db := run.db(set.key)
	down, pick := db.down, db.pick
	db.pick++
	g.mu.Unlock()
	tenants, heads, err := g.readHeads(run.ctx, set, down, pick)
	g.mu.Lock()
	moved := g.applyHeads(run, set, db, tenants, heads, err)
	read := err == nil && checkpoints && !down && run.ctx.Err() == nil
	if !read {
		g.probed(run, set, db)
	}
	g.mu.Unlock()
	headsDone <- moved
	if !read {
		return
	}
	cctx, cancel := context.WithTimeout(run.ctx, max(g.cfg.pollInterval, time.Second))
	cpTenants, cps, refused := g.readCheckpoints(cctx, set)
	cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probed(run, set, db)
	if run.ctx.Err() != nil || g.run != run {
		return
	}
	g.applyCheckpoints(run, set, cpTenants, cps, refused)
}

// probed ends the probe of set's database in flight, and asks for
// another if a wake-up's probe skipped it meanwhile (rewake). Called with
// mu held.
func (g *Group) probed(run *groupRun, set *probeSet, db *groupDB) {
	db.probing = false
	if !db.rewake || run.ctx.Err() != nil || g.run != run {
		return
	}
	db.rewake = false
	run.wakeDBs[set.tenants[0].feed.Database] = true
	select {
	case run.wakeReq <- struct{}{}:
	default: // a request is pending: it covers this one
	}
}

// applyHeads applies what a probe read of set's heads: the database is
// put down if nothing could be read (err), or up again (its held units
// queued) if something was, and the units of tenants whose head moved are
// woken; moved reports a head moved. Called with mu held.
func (g *Group) applyHeads(run *groupRun, set *probeSet, db *groupDB, tenants []*groupTenant, heads []int64, err error) (moved bool) {
	if run.ctx.Err() != nil || g.run != run {
		return false
	}
	now := time.Now()
	if err != nil {
		if !db.down || db.downErr == nil {
			g.cfg.logger.Warn("group: the database does not answer; its tenants wait until a probe reaches it",
				"database", set.tenants[0].feed.Database, "tenants", len(set.tenants), "held", len(db.held), "error", err)
		}
		db.down, db.downErr = true, err
		return false
	}
	if db.down {
		if db.downErr != nil {
			g.cfg.logger.Info("group: the database answers again; its tenants resume", "database", set.tenants[0].feed.Database, "held", len(db.held))
		}
		db.down, db.downErr = false, nil
		held := db.held
		db.held = nil
		for _, u := range held {
			if u.state == unitHeld {
				g.enqueue(run, u)
			}
		}
	}
	for i, t := range tenants {
		if heads[i] == t.seen || t.live == 0 {
			continue
		}
		t.seen, moved = heads[i], true
		for _, u := range t.units {
			if !u.isPartition() { // a partitioned definition's scan wakes those with events
				g.wake(run, u, false, now)
			}
		}
	}
	return moved
}

// applyCheckpoints applies what a checkpoint probe of set's tenants read
// (readCheckpoints). Called with mu held.
func (g *Group) applyCheckpoints(run *groupRun, set *probeSet, cpTenants []*groupTenant, cps [][]CheckpointProbe, refused bool) {
	for i, t := range cpTenants {
		if t.live == 0 {
			continue
		}
		for j, u := range t.units {
			g.noticeCheckpoint(run, u, cps[i][j])
		}
	}
	if refused {
		// No probe will read a resume for the units that went dormant on
		// a pause (noticeCheckpoint): they run, find the pause, and poll
		// for it again.
		for _, t := range set.tenants {
			for _, u := range t.units {
				if t.live > 0 && u.state == unitDormant && u.paused {
					g.wake(run, u, true, time.Time{})
				}
			}
		}
	}
}

// noticeCheckpoint applies what a checkpoint probe read of u's checkpoint
// (p): a dormant unit whose checkpoint moved (a reset elsewhere) or whose
// name was resumed runs, reading its checkpoint first; a retry backoff
// ends on the same changes; a unit that polls because its name is
// paused goes dormant instead, until a probe reads it resumed (or its
// head moves). Called with mu held.
func (g *Group) noticeCheckpoint(run *groupRun, u *groupUnit, p CheckpointProbe) {
	if u.parts != nil && !u.isPartition() {
		// A partitioned definition's count row: a count another process
		// changed (Repartition) queues the scan reading the checkpoints,
		// which finds it and ends the definition for the tenant. Its
		// partitions notice their own rows.
		if u.state == unitDormant && p.Position != 0 && p.Position != int64(len(u.parts.units)) {
			g.wake(run, u, true, time.Time{})
		}
		return
	}
	resumed := u.paused && !p.Paused
	u.paused = p.Paused
	moved := u.at >= 0 && p.Position != u.at
	switch {
	case u.state == unitDormant && (moved || resumed):
		g.wake(run, u, true, time.Time{})
	case u.state == unitWaiting && u.backoff && (moved || resumed):
		u.check = true
		g.enqueue(run, u)
	case u.state == unitWaiting && u.wakeable && p.Paused:
		g.stopTimer(run, u)
		u.state, u.check = unitDormant, true
	}
}

// readCheckpoints reads the checkpoints of set's tenants' names through
// the first tenant's CheckpointProber, one statement per probeChunk
// tenants; it returns the tenants it read, with what it read (by tenant,
// then definition). Without the capability, or once the prober refused
// the database's stores (logged once), it reads nothing: a change made
// elsewhere is then noticed at the tenant's next event; refused reports
// the prober refusing them just now (see probeDB). A failure, or an answer
// of the wrong shape, is logged and leaves its tenants out.
func (g *Group) readCheckpoints(ctx context.Context, set *probeSet) (tenants []*groupTenant, out [][]CheckpointProbe, refused bool) {
	prober, ok := set.tenants[0].feed.Checkpoints.(CheckpointProber)
	g.mu.Lock()
	if g.unprobedCheckpoints[set.key] {
		ok = false
	}
	g.mu.Unlock()
	if !ok {
		return nil, nil, false
	}
	names := g.probeNames
	for from := 0; from < len(set.tenants); from += probeChunk {
		chunk := set.tenants[from:min(from+probeChunk, len(set.tenants))]
		stores := make([]CheckpointStore, len(chunk))
		for i, t := range chunk {
			stores[i] = t.feed.Checkpoints
		}
		got, err := prober.ProbeCheckpoints(ctx, stores, names)
		if errors.Is(err, errors.ErrUnsupported) {
			g.mu.Lock()
			g.unprobedCheckpoints[set.key] = true
			g.mu.Unlock()
			g.cfg.logger.Warn("group: the database's checkpoints cannot be read together; a reset or resume made elsewhere on an idle tenant waits for its next event",
				"database", set.tenants[0].feed.Database, "tenants", len(set.tenants), "error", err)
			return nil, nil, true
		}
		if err == nil && !probeShaped(got, len(chunk), len(names)) {
			err = fmt.Errorf("%T.ProbeCheckpoints answered %d stores for %d, or not one probe per name", prober, len(got), len(chunk))
		}
		if err != nil {
			if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) { // not the Run's end
				g.cfg.logger.Warn("group: probing the tenants' checkpoints failed; will retry", "database", set.tenants[0].feed.Database, "tenants", len(chunk), "error", err)
			}
			if ctx.Err() != nil {
				break // out of time: the next chunks too
			}
			continue
		}
		tenants, out = append(tenants, chunk...), append(out, got...)
	}
	return tenants, out, false
}

// probeShaped reports whether a CheckpointProber's answer has one row per
// store and one probe per name in each: another's prober is checked
// before the group indexes it.
func probeShaped(got [][]CheckpointProbe, stores, names int) bool {
	if len(got) != stores {
		return false
	}
	for _, row := range got {
		if len(row) != names {
			return false
		}
	}
	return true
}

// overran puts set's database down when its read is still running after
// a poll interval: its units are held until the read returns.
func (g *Group) overran(run *groupRun, set *probeSet) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if db := run.db(set.key); db.probing && !db.down {
		db.down = true
		g.cfg.logger.Debug("group: probing the database takes longer than the poll interval; its tenants wait for the probe",
			"database", set.tenants[0].feed.Database, "poll_interval", g.cfg.pollInterval)
	}
}

// readHeads reads the feed heads of set's tenants: in one statement per
// probeChunk tenants through the first tenant's HeadProber, else one
// HeadPosition per tenant that has a caught-up or held unit (the others
// run anyway). It returns the tenants it read, with their heads; a
// failure is logged and leaves its tenants out. err is set when statements
// were tried and none succeeded: the database does not answer.
//
// On a database that is down, a probe that fails (or there is no prober)
// reads one tenant's head only, the pick-th in turn: one statement or two
// a probe to find whether it answers again, however many tenants it has;
// in turn, so that one tenant whose table cannot be read does not keep
// the others held once the server is back.
func (g *Group) readHeads(ctx context.Context, set *probeSet, down bool, pick int) ([]*groupTenant, []int64, error) {
	first := undecorated(set.tenants[0].feed.Events)
	prober, ok := first.(HeadProber)
	g.mu.Lock()
	if g.unprobed[set.key] {
		ok = false
	}
	g.mu.Unlock()
	if !ok {
		if down {
			return readOne(ctx, set.tenants[pick%len(set.tenants)])
		}
		return g.readEach(ctx, set.tenants, true, nil)
	}
	var tenants []*groupTenant
	var heads []int64
	var failed error
	for from := 0; from < len(set.tenants); from += probeChunk {
		chunk := set.tenants[from:min(from+probeChunk, len(set.tenants))]
		stores := make([]domain.EventStore, len(chunk))
		for i, t := range chunk {
			stores[i] = undecorated(t.feed.Events)
		}
		got, err := prober.ProbeHeads(ctx, stores)
		if errors.Is(err, errors.ErrUnsupported) {
			g.mu.Lock()
			g.unprobed[set.key] = true
			g.mu.Unlock()
			g.cfg.logger.Warn("group: the database's tenants cannot be probed in one statement; each idle tenant's head is read at every probe",
				"database", set.tenants[0].feed.Database, "tenants", len(set.tenants), "error", err)
			return g.readEach(ctx, set.tenants, true, nil)
		}
		if err != nil {
			if ctx.Err() != nil {
				return tenants, heads, nil
			}
			if down {
				return readOne(ctx, set.tenants[pick%len(set.tenants)])
			}
			// Each head on its own then, so that a prober that cannot read
			// another tenant's table (a Database shared by mistake) leaves
			// no tenant unwatched; a database that is down fails those
			// too, quietly: its failure is logged once, by probeDB.
			g.cfg.logger.Debug("group: probing the database's feed heads in one statement failed; reading each idle tenant's head", "database", set.tenants[0].feed.Database, "tenants", len(chunk), "error", err)
			got, read, rerr := g.readEach(ctx, chunk, false, err)
			tenants, heads = append(tenants, got...), append(heads, read...)
			if rerr != nil && failed == nil {
				failed = rerr
			}
			continue
		}
		tenants, heads = append(tenants, chunk...), append(heads, got...)
	}
	if len(tenants) > 0 {
		failed = nil // the database answers
	}
	return tenants, heads, failed
}

// readOne reads t's head, for readHeads.
func readOne(ctx context.Context, t *groupTenant) ([]*groupTenant, []int64, error) {
	head, err := t.feed.Events.HeadPosition(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	return []*groupTenant{t}, []int64{head}, nil
}

// readEach is readHeads without a prober: one HeadPosition per tenant of
// list that has a caught-up or held unit; a failure is logged when
// logFailures says so. probeErr, when set, is the failure of the prober's
// statement: the first tenant's head is then read even if it is not idle,
// so that a database that answers is told from one that does not. err is
// set when every read failed (or the only one tried was the prober's).
func (g *Group) readEach(ctx context.Context, list []*groupTenant, logFailures bool, probeErr error) ([]*groupTenant, []int64, error) {
	var tenants []*groupTenant
	var heads []int64
	var failed error
	tried := false
	for i, t := range list {
		g.mu.Lock()
		idle := i == 0 && probeErr != nil
		for _, u := range t.units {
			idle = idle || u.state == unitDormant || u.state == unitHeld
		}
		g.mu.Unlock()
		if !idle {
			continue
		}
		tried = true
		got, read, err := readOne(ctx, t)
		if ctx.Err() != nil {
			return tenants, heads, nil
		}
		if err != nil {
			if logFailures {
				g.cfg.logger.Warn("group: reading the tenant's feed head failed; will retry", "tenant", t.feed.Tenant, "error", err)
			}
			if failed == nil {
				failed = err
			}
			continue
		}
		tenants, heads = append(tenants, got...), append(heads, read...)
	}
	if !tried && probeErr != nil {
		return nil, nil, probeErr
	}
	if len(tenants) > 0 {
		failed = nil
	}
	return tenants, heads, failed
}
