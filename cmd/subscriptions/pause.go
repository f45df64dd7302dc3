package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/eventfeed/subscriptions"
)

// pauseState is what pause and resume print with -json: the name's pause
// as Status reads it once the command is done (the admin API's answer).
type pauseState struct {
	Subscriber string    `json:"subscriber"`
	Paused     bool      `json:"paused"`
	PausedAt   time.Time `json:"paused_at,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// pausedSubscriber is the subscriber called name (a partitioned one with
// its partitions) and its pause as it stands. Its log lines (the
// library's `subscriber paused` and `subscriber resumed`, the audit of
// these commands) carry by=cli:<user>.
func (c *cli) pausedSubscriber(ctx context.Context, d *database, name string) (*subscriptions.Subscriber, *group, pauseState, error) {
	groups, err := d.groups(ctx)
	if err != nil {
		return nil, nil, pauseState{}, err
	}
	g, err := findGroup(groups, name)
	if err != nil {
		return nil, nil, pauseState{}, err
	}
	sub, err := d.subscriber(g, c.logger().With("by", operator()))
	if err != nil {
		return nil, nil, pauseState{}, err
	}
	st, err := readPause(ctx, sub)
	return sub, g, st, err
}

// readPause reads sub's pause through Status (a checkpoint ahead of the
// head does not keep it from being read).
func readPause(ctx context.Context, sub *subscriptions.Subscriber) (pauseState, error) {
	st, err := sub.Status(ctx)
	if err != nil && !errors.Is(err, subscriptions.ErrCheckpointAhead) {
		return pauseState{}, err
	}
	return pauseState{Subscriber: sub.Name(), Paused: st.Paused, PausedAt: st.PausedAt, Reason: st.PauseReason}, nil
}

// since describes a pause for the terminal: when, and why if it was said.
func (p pauseState) since() string {
	s := "since " + p.PausedAt.UTC().Format(time.RFC3339)
	if reason := strings.Join(strings.Fields(p.Reason), " "); reason != "" {
		s += ": " + reason // on one line
	}
	return s
}

// pause stops the subscriber name everywhere (Subscriber.Pause): every
// replica and partition, in every process, handles nothing from its next
// batch until resume, across restarts. It asks first; a paused name is
// left as it is (a second pause would keep the first anyway).
func (c *cli) pause(ctx context.Context, d *database, name, reason string) error {
	sub, g, st, err := c.pausedSubscriber(ctx, d, name)
	if err != nil {
		return err
	}
	if st.Paused {
		if c.json {
			return c.printJSON(st)
		}
		fmt.Fprintf(c.stdout, "subscriber %q is already paused %s\n", name, st.since())
		return nil
	}
	what := fmt.Sprintf("subscriber %q", name)
	if g.partitions > 0 {
		what += fmt.Sprintf(" (its %d partitions)", g.partitions)
	}
	if err := c.confirm(fmt.Sprintf("Pause %s everywhere? Every replica, in every process, stops at its next batch and handles nothing until `subscriptions resume %s`.",
		what, name)); err != nil {
		return err
	}
	if err := sub.Pause(ctx, reason); err != nil {
		return err
	}
	if st, err = readPause(ctx, sub); err != nil {
		return fmt.Errorf("subscriber %q is paused, but reading its pause back failed: %w", name, err)
	}
	if c.json {
		return c.printJSON(st)
	}
	fmt.Fprintf(c.stdout, "paused: %s everywhere %s\n", what, st.since())
	return nil
}

// resume lifts the pause (Subscriber.Resume): the name's replicas go on
// from their checkpoints at their next poll. It asks first; a name that
// is not paused is left as it is.
func (c *cli) resume(ctx context.Context, d *database, name string) error {
	sub, _, st, err := c.pausedSubscriber(ctx, d, name)
	if err != nil {
		return err
	}
	if !st.Paused {
		if c.json {
			return c.printJSON(st)
		}
		fmt.Fprintf(c.stdout, "subscriber %q is not paused\n", name)
		return nil
	}
	if err := c.confirm(fmt.Sprintf("Resume subscriber %q, paused %s? Its replicas, in every process, go on from their checkpoints.",
		name, st.since())); err != nil {
		return err
	}
	if err := sub.Resume(ctx); err != nil {
		return err
	}
	if st, err = readPause(ctx, sub); err != nil {
		return fmt.Errorf("subscriber %q is resumed, but reading it back failed: %w", name, err)
	}
	if c.json {
		return c.printJSON(st)
	}
	fmt.Fprintf(c.stdout, "resumed: subscriber %q\n", name)
	return nil
}
