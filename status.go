package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// State is what a subscriber's Run is doing, as seen by the process that
// calls Status.
type State string

const (
	// StateStopped: Run is not running in this process (not started yet,
	// or returned).
	StateStopped State = "stopped"
	// StateRunning: Run is processing batches, or about to.
	StateRunning State = "running"
	// StateIdle: Run found nothing past the checkpoint (or another replica
	// holds it) and waits for a wake signal or the poll interval.
	StateIdle State = "idle"
	// StateRetrying: a handler failed and the event is being retried with
	// backoff before it is parked (with WithParkingLot).
	StateRetrying State = "retrying"
	// StateHalted: a handler failed and, without a parking lot, the
	// subscriber stays on that event, retrying it every poll interval.
	StateHalted State = "halted"
)

// EventRef names one event of the feed.
type EventRef struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Position int64  `json:"position"`
}

// Status is a snapshot of one subscriber: what the database says (its
// checkpoint, the feed head, the lag) and what this process's Run knows
// (its state, the last error, the last commit). It is a plain value, safe
// to copy and to serve as JSON; the EventRefs it points to are copies
// owned by the caller.
//
// The database figures are shared by every replica of the subscriber's
// name; State, the failure and LastCommitAt are this process's only: a
// standby replica (another one holds the checkpoint) reports idle, and a
// subscriber whose Run runs in another process reports stopped.
type Status struct {
	Subscriber string `json:"subscriber"`
	// Tenant is the tenant of a Group's subscriber (Feed.Tenant); "" for
	// a standalone Subscriber.
	Tenant string `json:"tenant,omitempty"`
	State  State  `json:"state"`
	// Position is the committed checkpoint; Head the feed head; Lag their
	// difference in positions (one per event on this module's stores).
	Position int64 `json:"position"`
	Head     int64 `json:"head"`
	Lag      int64 `json:"lag"`
	// LagSeconds is the age of the oldest event not yet handled: now minus
	// its Created time (set by domain.NewEventEnvelope, normally just
	// before Append); 0 when caught up.
	LagSeconds float64 `json:"lag_seconds"`
	// Parked counts the subscriber's parked events; -1 without a parking
	// lot.
	Parked int `json:"parked"`
	// Held counts those of them held behind an earlier parked event of
	// their aggregate (WithOrderedParking; 0 without it).
	Held int `json:"held,omitempty"`
	// Paused reports that the name is paused everywhere (Pause), since
	// PausedAt, with PauseReason, Pause's reason: nothing of it is
	// handled until Resume, and Healthy does not take its lag for a stuck
	// subscriber.
	Paused      bool      `json:"paused,omitempty"`
	PausedAt    time.Time `json:"paused_at,omitzero"`
	PauseReason string    `json:"pause_reason,omitempty"`
	// Failing is the event being retried (StateRetrying) or halted on
	// (StateHalted), with the number of attempts made so far.
	Failing  *EventRef `json:"failing,omitempty"`
	Attempts int       `json:"attempts,omitempty"`
	// LastError is the last failure this process's Run met (a handler
	// error, a database error), when, and on which event if any. It stays
	// after recovery: State tells whether the failure is over.
	LastError      string    `json:"last_error,omitempty"`
	LastErrorAt    time.Time `json:"last_error_at,omitzero"`
	LastErrorEvent *EventRef `json:"last_error_event,omitempty"`
	// LastCommitAt is when this process last committed a batch that moved
	// the checkpoint.
	LastCommitAt time.Time `json:"last_commit_at,omitzero"`
	// ProgressAt is when the checkpoint was last seen to move or to be
	// caught up: by a commit or an idle cycle of this process's Run, or by a
	// Status call. It is what Healthy's stuck check measures from.
	ProgressAt time.Time `json:"progress_at"`
	// CheckedAt is when the snapshot was taken.
	CheckedAt time.Time `json:"checked_at"`
	// Partitions are a partitioned subscriber's partitions, by partition
	// (nil for an unpartitioned one). The figures above then sum them up:
	// Lag is their sum, LagSeconds the largest, Position the lowest
	// checkpoint with events behind it (the head when none has any), State
	// the most pressing (halted, retrying, running, idle) with its failing
	// event, ProgressAt the oldest of those with lag.
	Partitions []PartitionStatus `json:"partitions,omitempty"`
}

// PartitionStatus is one partition of a partitioned subscriber in Status:
// its checkpoint, the events of the partition past it and the age of the
// oldest, and this process's state of the partition.
type PartitionStatus struct {
	Partition  int       `json:"partition"`
	State      State     `json:"state"`
	Position   int64     `json:"position"`
	Lag        int64     `json:"lag"`
	LagSeconds float64   `json:"lag_seconds"`
	Failing    *EventRef `json:"failing,omitempty"`
	Attempts   int       `json:"attempts,omitempty"`
	// ProgressAt is when this partition's checkpoint was last seen to move
	// or to be caught up (see Status.ProgressAt).
	ProgressAt time.Time `json:"progress_at"`
}

// Status reports the subscriber's state. It reads the checkpoint, the feed
// head, the oldest unhandled event (only when the lag is positive) and the
// parked count: three or four indexed statements (one more for the held
// count with WithOrderedParking), no transaction and no lock, so it is
// cheap enough for a metrics scrape or a readiness probe.
// Safe for concurrent use, including while Run runs.
//
// A database error is returned with a zero Status. A checkpoint ahead of the head returns the Status
// (lag 0) with an error wrapping ErrCheckpointAhead, as Lag does.
func (s *Subscriber) Status(ctx context.Context) (Status, error) {
	st, _, err := s.status(ctx)
	return st, err
}

// status is Status, with the times the checkpoints were last seen to move
// or catch up as monotonic readings (Status.ProgressAt is UTC and has
// none), for Healthy's stuck check: one for an unpartitioned subscriber,
// one per partition (Status.Partitions) for a partitioned one.
func (s *Subscriber) status(ctx context.Context) (Status, []time.Time, error) {
	if s.partitions > 0 {
		return s.partitionStatus(ctx)
	}
	position, head, ahead := s.positions(ctx, "status")
	if ahead != nil && !errors.Is(ahead, ErrCheckpointAhead) {
		return Status{}, nil, ahead
	}
	now := time.Now()
	st := Status{Subscriber: s.name, Tenant: s.tenant, Position: position, Head: head, Parked: -1, CheckedAt: now.UTC()}
	if head > position {
		st.Lag = head - position
		age, err := s.lagAge(ctx, s.events, position, now)
		if err != nil {
			return Status{}, nil, fmt.Errorf("subscriptions: status of %q: %w", s.name, err)
		}
		st.LagSeconds = age
	}
	if err := s.pausedAndParked(ctx, &st); err != nil {
		return Status{}, nil, err
	}
	live := s.tel.seen(position, head)
	live.fill(&st)
	return st, []time.Time{live.progressAt}, ahead
}

// lagAge is the age in seconds of the oldest event of feed past position
// (0 when it has no creation time).
func (s *Subscriber) lagAge(ctx context.Context, feed domain.EventStore, position int64, now time.Time) (float64, error) {
	oldest, err := feed.ReadAfter(ctx, position, 1)
	if err != nil {
		return 0, fmt.Errorf("oldest unhandled event: %w", err)
	}
	if len(oldest) == 0 || oldest[0].Created.IsZero() {
		return 0, nil
	}
	return max(0, now.Sub(oldest[0].Created).Seconds()), nil
}

// pausedAndParked fills st.Paused (where the store can pause) and st.Parked.
func (s *Subscriber) pausedAndParked(ctx context.Context, st *Status) error {
	if p, ok := s.checkpoints.(Pauser); ok {
		rec, paused, err := p.PausedSince(ctx, s.name)
		if err != nil {
			return err // the store names the subscriber
		}
		st.Paused, st.PausedAt, st.PauseReason = paused, rec.Since, rec.Reason
	}
	if s.parking == nil {
		return nil
	}
	n, err := countParked(ctx, s.parking, s.name)
	if err != nil {
		return err // the lot names the subscriber
	}
	st.Parked = n
	if s.queues != nil {
		if st.Held, err = s.queues.lot.CountHeld(ctx, s.name); err != nil {
			return err // the lot names the subscriber
		}
	}
	return nil
}

// fill copies the live state into st.
func (l liveStatus) fill(st *Status) {
	st.State = l.state
	st.Failing, st.Attempts = l.failing, l.attempt
	st.LastError, st.LastErrorAt, st.LastErrorEvent = l.lastError, l.lastErrorAt, l.errorEvent
	st.LastCommitAt = l.lastCommit
	st.ProgressAt = l.progressAt.UTC()
}

// ParkedCounter is the optional capability of a ParkingLot that counts a
// subscriber's parked events without reading them (a COUNT). Status,
// Healthy and the parked gauge use it; without it they list the entries
// and count them. This package's lots have it.
type ParkedCounter interface {
	// CountParked returns how many events are parked for subscriber.
	CountParked(ctx context.Context, subscriber string) (int, error)
}

func countParked(ctx context.Context, lot ParkingLot, subscriber string) (int, error) {
	if c, ok := lot.(ParkedCounter); ok {
		return c.CountParked(ctx, subscriber)
	}
	parked, err := lot.List(ctx, subscriber)
	if err != nil {
		return 0, fmt.Errorf("subscriptions: count parked events of %q: %w", subscriber, err)
	}
	return len(parked), nil
}

var (
	// ErrSubscriberStopped is reported by Healthy when Run is not running
	// in this process.
	ErrSubscriberStopped = errors.New("subscriber is not running")
	// ErrSubscriberHalted is reported by Healthy when the subscriber stays
	// on a failing event (no parking lot).
	ErrSubscriberHalted = errors.New("subscriber is halted on a failing event")
	// ErrSubscriberStuck is reported by Healthy when events wait and the
	// checkpoint has not moved for longer than WithStuckThreshold.
	ErrSubscriberStuck = errors.New("subscriber is stuck: events wait and the checkpoint does not move")
	// ErrLagTooOld is reported by Healthy when the oldest unhandled event
	// is older than WithMaxLagTime.
	ErrLagTooOld = errors.New("subscriber lags too far behind in time")
)

// Healthy reports whether the subscriber is fit to serve, for a readiness
// probe: nil, or an error saying why not. It wraps ErrSubscriberStopped
// when Run is not running in this process, ErrSubscriberHalted when it
// stays on a failing event, ErrSubscriberStuck when events wait and the
// checkpoint has not moved for longer than WithStuckThreshold (a handler
// that hangs, a retry that takes too long, a lock held elsewhere),
// ErrLagTooOld when WithMaxLagTime is set and exceeded, and the database
// error when Status cannot read the database. It costs one Status call.
//
// "Not moved" is measured from the last time this process saw the
// checkpoint move or catch up with the head (see Status.ProgressAt), so a
// stuck subscriber is reported at most the threshold after Run started,
// the checkpoint last moved or the subscriber was last caught up. An idle
// subscriber (waiting for a wake signal or the next poll) is given the
// poll interval on top of the threshold: without a wake signal, events
// appended after a poll rightly wait up to WithPollInterval, however long
// that is, and are not a stuck subscriber.
func (s *Subscriber) Healthy(ctx context.Context) error {
	st, progress, err := s.status(ctx)
	if err != nil {
		return err // Status names the subscriber
	}
	switch st.State {
	case StateStopped:
		return fmt.Errorf("subscriptions: health of %q: %w", s.name, ErrSubscriberStopped)
	case StateHalted:
		var on EventRef
		if st.Failing != nil {
			on = *st.Failing
		}
		return fmt.Errorf("subscriptions: health of %q: event %q (type %q, position %d), %d attempts, last error %q: %w",
			s.name, on.ID, on.Type, on.Position, st.Attempts, st.LastError, ErrSubscriberHalted)
	}
	if st.Paused {
		return nil // lag is expected until Resume
	}
	// Each checkpoint row on its own: a partition that hangs is stuck
	// however busy the others are.
	rows := []PartitionStatus{{Partition: -1, State: st.State, Position: st.Position, Lag: st.Lag}}
	if st.Partitions != nil {
		rows = st.Partitions
	}
	for i, row := range rows {
		if still, allowed, stuck := s.stuckFor(row, progress[i]); stuck {
			where := ""
			if row.Partition >= 0 {
				where = fmt.Sprintf("partition %d of %d: ", row.Partition, s.partitions)
			}
			return fmt.Errorf("subscriptions: health of %q: %s%s, lag %d, checkpoint %d unchanged for %v (allowed %v): %w",
				s.name, where, row.State, row.Lag, row.Position, still.Round(time.Millisecond), allowed, ErrSubscriberStuck)
		}
	}
	if st.Lag > 0 && s.maxLagTime > 0 && st.LagSeconds > s.maxLagTime.Seconds() {
		return fmt.Errorf("subscriptions: health of %q: oldest unhandled event is %.3fs old (limit %v): %w",
			s.name, st.LagSeconds, s.maxLagTime, ErrLagTooOld)
	}
	return nil
}

// stuckFor is Healthy's stuck rule for one checkpoint row (a partition, or
// an unpartitioned subscriber's only row), kept in one place so that the
// admin page flags the partitions Healthy would report: how long the
// row's checkpoint has stood still while events wait (progress is its
// monotonic reading from status), how long that may last, and whether it
// lasted longer. An idle row is given the poll interval on top of the
// threshold: without a wake signal, events appended after a poll rightly
// wait for the next one.
func (s *Subscriber) stuckFor(row PartitionStatus, progress time.Time) (still, allowed time.Duration, stuck bool) {
	if row.Lag == 0 {
		return 0, 0, false
	}
	allowed = s.stuckThreshold
	if row.State == StateIdle {
		allowed += s.pollInterval
	}
	still = time.Since(progress)
	return still, allowed, still > allowed
}
