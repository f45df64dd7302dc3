package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// errNoHandler is what the CLI's subscribers' handler returns: the CLI
// never processes events (see database.subscriber).
var errNoHandler = errors.New("the subscriptions CLI has no event handler")

// layout names a partition count for people: "4 partitions", or
// "unpartitioned".
func layout(n int) string {
	if n == 0 {
		return "unpartitioned"
	}
	return strconv.Itoa(n) + " partitions"
}

// repartition changes a subscriber's partition count to n
// (Subscriber.Repartition; 0: unpartitioned). Repartition brings the
// partitions to their highest checkpoint first, which takes a handler when
// some lag behind it: the CLI has none, so it succeeds when the partitions
// are at one position (the application stopped after catching up, or a
// quiet feed), and otherwise changes nothing and says what to do.
func (c *cli) repartition(ctx context.Context, d *database, name string, n int) error {
	groups, err := d.groups(ctx)
	if err != nil {
		return err
	}
	g, err := findGroup(groups, name)
	if err != nil {
		return err
	}
	if g.partitions == n {
		return fmt.Errorf("repartition: %s is %s already; nothing was changed", subject(d.tenant, name), layout(n))
	}
	sub, err := d.subscriber(g, c.auditLogger())
	if err != nil {
		return err
	}
	if err := c.confirm(fmt.Sprintf("Repartition %s from %s to %s? Processes running it with the old count stop at their next batch "+
		"(ErrPartitionsChanged): start them again with the new one.", subject(d.tenant, name), layout(g.partitions), layout(n))); err != nil {
		return err
	}
	if err := sub.Repartition(ctx, n); err != nil {
		if errors.Is(err, errNoHandler) {
			return fmt.Errorf("repartition: some partitions of %q lag behind the highest checkpoint, and bringing them there needs the application's handler; "+
				"nothing was changed. Let the application catch up (status -partitions) and run this again, or call Subscriber.Repartition in the application: %w", name, err)
		}
		return err
	}
	first := name
	if n > 0 {
		first = fmt.Sprintf("%s/partition-0-of-%d", name, n)
	}
	position, err := d.checkpoints.Position(ctx, first)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(withTenant(d.tenant, map[string]any{"subscriber": name, "from": g.partitions, "partitions": n, "position": position}))
	}
	fmt.Fprintf(c.stdout, "repartitioned: %s from %s to %s at position %d\n", subject(d.tenant, name), layout(g.partitions), layout(n), position)
	return nil
}
