package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// scanCycle is the cycle of a partitioned definition's scan unit (see
// groupParts): the first of a Run starts the partitions (firstScan); one
// with check reads every partition's checkpoint and the count in one
// statement, as the coordinator's sweep does, and queues every partition (as the coordinator's sweep hands them over); any other reads
// the feed past scanned in one statement (two on a backlog) and queues
// the partitions that got events. It holds no checkpoint.
// What it found is applied by afterScan. ps.ready is written only by
// afterScan under the group's mu, before the worker running this took the
// unit under it.
func (g *Group) scanCycle(ctx context.Context, ps *groupParts, check bool) outcome {
	s := ps.parent
	if !ps.ready {
		return g.firstScan(ctx, ps)
	}
	if check {
		names := s.partitionNames()
		positions, err := s.checkpointPositions(ctx, names)
		if err == nil && slices.Contains(positions, RetiredCheckpoint) {
			err = s.retiredError(ctx, names[slices.Index(positions, RetiredCheckpoint)])
		}
		if errors.Is(err, ErrPartitionsChanged) {
			ps.fatal = err
			return outcomeFatal
		}
		if err != nil {
			return scanFailed(ctx, s, "subscriber: reading the partition checkpoints failed; will retry", err)
		}
		if ps.index != nil {
			ps.index.rewind(slices.Min(positions), slices.Max(positions))
		}
		ps.foundAll, ps.positions = true, positions
		return outcomeIdle
	}
	parts, all, next, err := s.scanFeed(ctx, ps.scanned)
	if err != nil {
		return scanFailed(ctx, s, "subscriber: reading the feed failed; will retry", err)
	}
	ps.found, ps.foundAll, ps.scanned = parts, all, next
	return outcomeIdle
}

// firstScan is a partitioned Run's start for one tenant: the head it reads
// is where the scans start, so that every event committed after it is
// found by a scan and every one before it by the partitions' first
// cycles, which read from their checkpoints; the partition count is
// checked and the partitions are seeded on first use (initPartitions);
// the checkpoints read start the feed index and each partition's first
// batch. A count that changed is fatal; any other failure is retried
// after the poll interval.
func (g *Group) firstScan(ctx context.Context, ps *groupParts) outcome {
	s := ps.parent
	head, err := s.events.HeadPosition(ctx)
	if err != nil {
		if errors.Is(err, domain.ErrGlobalOrderingNotSupported) {
			ps.fatal = fmt.Errorf("subscriptions: subscriber %q cannot run: %w", s.name, err)
			return outcomeFatal
		}
		return scanFailed(ctx, s, "subscriber: reading the feed head failed; will retry", err)
	}
	if err := s.initPartitions(ctx); err != nil {
		if errors.Is(err, ErrPartitionsChanged) {
			ps.fatal = err
			return outcomeFatal
		}
		return scanFailed(ctx, s, "subscriber: initialising the partitions failed; will retry", err)
	}
	positions, err := s.storePositions(ctx, s.partitionNames())
	if err != nil {
		positions = nil
		if ctx.Err() == nil {
			s.logger.Warn("subscriber: reading the partition checkpoints failed; each partition reads its own instead", "subscriber", s.name, "error", err)
		}
	}
	if positions != nil && ps.index != nil {
		ps.index.start(slices.Min(positions))
	}
	ps.scanned, ps.foundAll, ps.foundCheck, ps.positions, ps.nowReady = head, true, positions == nil, positions, true
	return outcomeIdle
}

// scanFailed logs a scan's failure (nothing when ctx ended: the tenant is
// removed or the Run ends) and records it as the definition's last error.
func scanFailed(ctx context.Context, s *Subscriber, msg string, err error) outcome {
	if ctx.Err() != nil {
		return outcomeStopped
	}
	s.logger.Error(msg, "subscriber", s.name, "error", err)
	s.tel.fail("", nil, 0, err)
	return outcomeFailed
}

// afterScan schedules a scan unit by what its cycle came to and wakes the
// partitions it found. Called with mu held.
func (g *Group) afterScan(run *groupRun, u *groupUnit, out outcome) {
	ps := u.parts
	dirty, recheck := u.dirty, u.recheck
	u.dirty, u.recheck = false, false
	if ps.nowReady {
		ps.ready, ps.nowReady = true, false
	}
	found, all, check, positions := ps.found, ps.foundAll, ps.foundCheck, ps.positions
	ps.found, ps.foundAll, ps.foundCheck, ps.positions = nil, false, false, nil
	if u.t.ctx.Err() != nil || out == outcomeStopped {
		g.end(u) // removed, or the Run ends
		return
	}
	switch out {
	case outcomeIdle:
		if all {
			n := len(ps.units)
			for i := range n {
				p := (ps.offset + i) % n
				g.wakeRead(run, ps.units[p], check, positions, p, ps.woken)
			}
		}
		for _, p := range found {
			g.wake(run, ps.units[p], false, ps.woken)
		}
		if dirty || recheck {
			u.check = recheck
			g.enqueue(run, u)
		} else {
			u.check, u.state = false, unitDormant
		}
	case outcomeFailed:
		u.check = u.check || recheck
		g.wait(run, u, ps.parent.pollInterval, false, false)
	}
}

// wakeRead queues partition unit pu of a scan that woke every partition:
// with the checkpoint the scan read (positions[p]; positions nil: to read
// first when check), handed to its runner unless a worker holds it or a
// retry is due (those read their checkpoint again before the next batch,
// and a due retry runs at once, as after a reset). Called with mu held.
func (g *Group) wakeRead(run *groupRun, pu *groupUnit, check bool, positions []int64, p int, at time.Time) {
	if positions == nil || pu.r == nil {
		g.wake(run, pu, check, at)
		return
	}
	if pu.state == unitRunning || (pu.state == unitWaiting && pu.backoff) {
		g.wake(run, pu, true, at)
		return
	}
	pu.r.known = positions[p] // no worker holds it
	g.wake(run, pu, false, at)
}

// failParts ends a partitioned definition for a tenant in this Run: a
// partition count that changed (a Repartition elsewhere), or an event
// store without a global ordered feed. It is logged once and shown by the
// definition's Status; its units end, those running once their cycle
// has. Called with mu held.
func (g *Group) failParts(run *groupRun, ps *groupParts, err error) {
	if ps.failed {
		return
	}
	ps.failed = true
	s := ps.parent
	s.logger.Error("group: subscriber cannot run for this tenant; it stops", "subscriber", s.name, "error", err)
	s.tel.fail("", nil, 0, err)
	for _, u := range append([]*groupUnit{ps.scan}, ps.units...) {
		if u.state != unitRunning {
			g.end(u)
		}
	}
}
