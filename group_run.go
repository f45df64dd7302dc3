package subscriptions

import (
	"context"
	"errors"
	"fmt"
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
)

// groupTenant is one Feed of a Group. Its run fields are guarded by the
// group's mu.
type groupTenant struct {
	feed Feed
	// key groups the tenants probed together: Feed.Database, or the
	// tenant's own key when it has none.
	key   string
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
	s *Subscriber

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
	wakeable bool
	timer    *time.Timer
}

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
	run := &groupRun{ctx: runCtx, cancel: cancel, cond: sync.NewCond(&g.mu), wakeDBs: map[string]bool{}, wakeReq: make(chan struct{}, 1)}
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
	g.cfg.logger.Info("group stopped")
	if run.panicked != nil {
		panic(run.panicked)
	}
	return nil
}

// startTenant starts t's units in run, each queued with its checkpoint to
// read. Called with mu held.
func (g *Group) startTenant(run *groupRun, t *groupTenant) {
	t.ctx, t.cancel = context.WithCancel(withTenant(run.ctx, t.feed.Tenant))
	t.seen = -1
	for _, u := range t.units {
		drain, stop := u.s.drainContext(t.ctx)
		u.r = newRunner(u.s, nil, drain)
		u.stopDrain = stop
		u.s.tel.started()
		u.unobserve = u.s.tel.observe(u.s)
		u.check, u.dirty, u.recheck, u.woken = true, false, false, time.Time{}
		t.live++
		g.enqueue(run, u)
	}
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
// wake-up may cut the wait short. Called with mu held.
func (g *Group) wait(run *groupRun, u *groupUnit, d time.Duration, wakeable bool) {
	g.stopTimer(run, u)
	u.state, u.wakeable = unitWaiting, wakeable
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
	u.stopDrain()
	u.unobserve()
	u.s.tel.setState(StateStopped)
	u.r = nil
	t := u.t
	t.live--
	if t.live == 0 {
		t.cancel()
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
	for _, u := range t.units {
		u.s.running.Store(false)
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
	switch u.state {
	case unitDormant:
		u.check, u.woken = check, at
		g.enqueue(run, u)
	case unitWaiting:
		if u.wakeable { // as Run's wait: a wake-up reads after the known position
			u.check, u.woken = check, at
			g.enqueue(run, u)
		} else if check {
			u.check = true
		}
	case unitQueued:
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

// next takes the first unit of the ready queue whose tenant still runs,
// and marks it running; nil once the Run ends.
func (g *Group) next(run *groupRun) (*groupUnit, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		for len(run.ready) == 0 && run.ctx.Err() == nil {
			run.cond.Wait()
		}
		if run.ctx.Err() != nil {
			return nil, false
		}
		u := run.ready[0]
		run.ready[0] = nil
		run.ready = run.ready[1:]
		if u.state != unitQueued {
			continue // ended while queued
		}
		if u.t.ctx.Err() != nil {
			g.end(u)
			continue
		}
		u.state = unitRunning
		u.r.wokenAt, u.woken = u.woken, time.Time{}
		return u, u.check
	}
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
	return u.r.cycle(u.t.ctx, check), true
}

// after schedules u by what its cycle came to, as Run's loop does.
func (g *Group) after(run *groupRun, u *groupUnit, out outcome) {
	s := u.s
	g.mu.Lock()
	defer g.mu.Unlock()
	dirty, recheck := u.dirty, u.recheck
	u.dirty, u.recheck = false, false
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
		if dirty || recheck {
			u.check = recheck
			g.enqueue(run, u)
		} else {
			u.check = true
			g.wait(run, u, s.pollInterval, true)
		}
	case outcomeFailed:
		u.check = recheck
		g.wait(run, u, s.pollInterval, false)
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
			g.probe(run, nil)
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
			if !g.probe(run, dbs) {
				rechecks, recheckDBs = 0, dbs
				recheck.Reset(wakeRechecks[0])
			}
		case <-recheck.C:
			if g.probe(run, recheckDBs) || rechecks+1 >= len(wakeRechecks) {
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
func (g *Group) probe(run *groupRun, only map[string]bool) (moved bool) {
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
		set := byKey[t.key]
		if set == nil {
			set = &probeSet{key: t.key}
			byKey[t.key] = set
			sets = append(sets, set)
		}
		set.tenants = append(set.tenants, t)
	}
	g.mu.Unlock()
	for _, set := range sets {
		if run.ctx.Err() != nil {
			return moved
		}
		tenants, heads := g.readHeads(run.ctx, set)
		now := time.Now()
		g.mu.Lock()
		for i, t := range tenants {
			if heads[i] == t.seen || t.live == 0 {
				continue
			}
			t.seen, moved = heads[i], true
			for _, u := range t.units {
				g.wake(run, u, false, now)
			}
		}
		g.mu.Unlock()
	}
	return moved
}

// readHeads reads the feed heads of set's tenants: in one statement per
// probeChunk tenants through the first tenant's HeadProber, else one
// HeadPosition per tenant that has a caught-up unit (the others run
// anyway). It returns the tenants it read, with their heads; a failure is
// logged and leaves its tenants out.
func (g *Group) readHeads(ctx context.Context, set *probeSet) ([]*groupTenant, []int64) {
	first := undecorated(set.tenants[0].feed.Events)
	prober, ok := first.(HeadProber)
	g.mu.Lock()
	if g.unprobed[set.key] {
		ok = false
	}
	g.mu.Unlock()
	if ok {
		var tenants []*groupTenant
		var heads []int64
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
				return g.readEach(ctx, set.tenants, true)
			}
			if err != nil {
				if ctx.Err() != nil {
					return tenants, heads
				}
				// Each head on its own then, so that a prober that cannot read
				// another tenant's table (a Database shared by mistake) leaves
				// no tenant unwatched; a database that is down fails those
				// too, quietly: the probe's failure is logged.
				g.cfg.logger.Warn("group: probing the database's feed heads in one statement failed; reading each idle tenant's head", "database", set.tenants[0].feed.Database, "tenants", len(chunk), "error", err)
				got, read := g.readEach(ctx, chunk, false)
				tenants, heads = append(tenants, got...), append(heads, read...)
				continue
			}
			tenants, heads = append(tenants, chunk...), append(heads, got...)
		}
		return tenants, heads
	}
	return g.readEach(ctx, set.tenants, true)
}

// readEach is readHeads without a prober: one HeadPosition per tenant of
// list that has a caught-up unit; a failure is logged when logFailures
// says so.
func (g *Group) readEach(ctx context.Context, list []*groupTenant, logFailures bool) ([]*groupTenant, []int64) {
	var tenants []*groupTenant
	var heads []int64
	for _, t := range list {
		g.mu.Lock()
		idle := false
		for _, u := range t.units {
			idle = idle || u.state == unitDormant
		}
		g.mu.Unlock()
		if !idle {
			continue
		}
		head, err := t.feed.Events.HeadPosition(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if logFailures {
				g.cfg.logger.Warn("group: reading the tenant's feed head failed; will retry", "tenant", t.feed.Tenant, "error", err)
			}
			continue
		}
		tenants, heads = append(tenants, t), append(heads, head)
	}
	return tenants, heads
}
