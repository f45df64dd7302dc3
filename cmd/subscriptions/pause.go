package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
)

// pausedSubscriber is the subscriber called name (a partitioned one with
// its partitions) and its pause as it stands. Its log lines (the
// library's `subscriber paused` and `subscriber resumed`, the audit of
// these commands) carry by=cli:<user> (auditLogger).
func (c *cli) pausedSubscriber(ctx context.Context, d *database, name string) (*subscriptions.Subscriber, *group, admin.PauseState, error) {
	groups, err := d.groups(ctx)
	if err != nil {
		return nil, nil, admin.PauseState{}, err
	}
	g, err := findGroup(groups, name)
	if err != nil {
		return nil, nil, admin.PauseState{}, err
	}
	sub, err := d.subscriber(g, c.auditLogger())
	if err != nil {
		return nil, nil, admin.PauseState{}, err
	}
	st, err := c.readPause(ctx, d, sub)
	return sub, g, st, err
}

// readPause is admin.ReadPause with d's tenant.
func (c *cli) readPause(ctx context.Context, d *database, sub *subscriptions.Subscriber) (admin.PauseState, error) {
	st, err := admin.ReadPause(ctx, sub)
	st.Tenant = d.tenant
	return st, err
}

// pausedSince describes a pause for the terminal: since when, and why if
// it was said.
func pausedSince(p admin.PauseState) string {
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
		fmt.Fprintf(c.stdout, "%s is already paused %s\n", subject(d.tenant, name), pausedSince(st))
		return nil
	}
	what := subject(d.tenant, name)
	if g.partitions > 0 {
		what += fmt.Sprintf(" (its %d partitions)", g.partitions)
	}
	if err := c.confirm(fmt.Sprintf("Pause %s everywhere? Every replica, in every process, stops at its next batch and handles nothing until `subscriptions resume %s%s`.",
		what, tenantArgs(d.tenant), name)); err != nil {
		return err
	}
	if err := sub.Pause(ctx, reason); err != nil {
		return err
	}
	if st, err = c.readPause(ctx, d, sub); err != nil {
		return fmt.Errorf("%s is paused, but: %w", subject(d.tenant, name), err)
	}
	if c.json {
		return c.printJSON(st)
	}
	fmt.Fprintf(c.stdout, "paused: %s everywhere %s\n", what, pausedSince(st))
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
		fmt.Fprintf(c.stdout, "%s is not paused\n", subject(d.tenant, name))
		return nil
	}
	if err := c.confirm(fmt.Sprintf("Resume %s, paused %s? Its replicas, in every process, go on from their checkpoints.",
		subject(d.tenant, name), pausedSince(st))); err != nil {
		return err
	}
	if err := sub.Resume(ctx); err != nil {
		return err
	}
	if st, err = c.readPause(ctx, d, sub); err != nil {
		return fmt.Errorf("%s is resumed, but: %w", subject(d.tenant, name), err)
	}
	if c.json {
		return c.printJSON(st)
	}
	fmt.Fprintf(c.stdout, "resumed: %s\n", subject(d.tenant, name))
	return nil
}
