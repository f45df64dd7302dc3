package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/user"
	"strconv"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/migrations"
)

func (c *cli) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c.stderr, nil))
}

// dbStatus is a subscriber's Status as the CLI shows it. Status.State is
// what a Run in the calling process is doing, always "stopped" here, so
// the CLI replaces it with what the database says: caught up, behind, or
// a checkpoint ahead of the head; Error is a read that failed.
type dbStatus struct {
	subscriptions.Status
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// status prints every subscriber's status (Subscriber.Status, read from
// the database).
func (c *cli) status(ctx context.Context, d *database) error {
	names, err := d.subscriberNames(ctx)
	if err != nil {
		return err
	}
	out := make([]dbStatus, 0, len(names))
	for _, name := range names {
		sub, err := d.subscriber(name, c.logger())
		if err != nil {
			return err
		}
		st, err := sub.Status(ctx)
		row := dbStatus{Status: st}
		switch {
		case errors.Is(err, subscriptions.ErrCheckpointAhead):
			row.State = "checkpoint ahead of head"
		case err != nil:
			row.Subscriber, row.State, row.Error = name, "error", err.Error()
		case st.Lag > 0:
			row.State = "behind"
		default:
			row.State = "caught up"
		}
		out = append(out, row)
	}
	if c.json {
		return c.printJSON(map[string]any{"subscribers": out})
	}
	if len(out) == 0 {
		fmt.Fprintln(c.stdout, "no subscribers in this database")
		return nil
	}
	rows := make([][]string, 0, len(out))
	for _, s := range out {
		state := s.State
		if s.Error != "" {
			state += ": " + s.Error
		}
		rows = append(rows, []string{s.Subscriber, strconv.FormatInt(s.Position, 10), strconv.FormatInt(s.Head, 10),
			strconv.FormatInt(s.Lag, 10), seconds(s.LagSeconds), strconv.Itoa(s.Parked), state})
	}
	return c.table([]string{"SUBSCRIBER", "POSITION", "HEAD", "LAG", "LAG_TIME", "PARKED", "STATE"}, rows)
}

// subscribersFor returns -subscriber's name (checked to exist) or every
// subscriber.
func (c *cli) subscribersFor(ctx context.Context, d *database) ([]string, error) {
	names, err := d.subscriberNames(ctx)
	if err != nil {
		return nil, err
	}
	if c.subscriber == "" {
		return names, nil
	}
	for _, n := range names {
		if n == c.subscriber {
			return []string{n}, nil
		}
	}
	return nil, fmt.Errorf("no subscriber %q in this database (status lists them)", c.subscriber)
}

func (c *cli) parkedList(ctx context.Context, d *database) error {
	names, err := c.subscribersFor(ctx, d)
	if err != nil {
		return err
	}
	filter := subscriptions.ParkedFilter{EventType: c.eventType, AggregateID: c.aggregate, AfterPosition: c.after, Limit: c.limit}
	type listed struct {
		Subscriber string                   `json:"subscriber"`
		Page       subscriptions.ParkedPage `json:"page"`
	}
	var all []listed
	for _, name := range names {
		sub, err := d.subscriber(name, c.logger())
		if err != nil {
			return err
		}
		page, err := sub.ListParkedPage(ctx, filter)
		if err != nil {
			return err
		}
		all = append(all, listed{name, page})
	}
	if c.json {
		return c.printJSON(map[string]any{"parked": all})
	}
	var rows [][]string
	var more []string
	for _, l := range all {
		for _, p := range l.Page.Events {
			rows = append(rows, []string{p.Subscriber, strconv.FormatInt(p.Position, 10), p.EventID, p.EventType, p.AggregateID,
				strconv.Itoa(p.Attempts), p.ParkedAt.UTC().Format(time.RFC3339), p.Error})
		}
		if l.Page.More {
			more = append(more, fmt.Sprintf("more parked events of %s: add -after %d", l.Subscriber, l.Page.NextAfter))
		}
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stdout, "no parked events")
		return nil
	}
	if err := c.table([]string{"SUBSCRIBER", "POSITION", "EVENT_ID", "TYPE", "AGGREGATE", "ATTEMPTS", "LAST_FAILURE", "ERROR"}, rows); err != nil {
		return err
	}
	for _, m := range more {
		fmt.Fprintln(c.stdout, m)
	}
	return nil
}

// findParked finds the one subscriber that parked eventID (or checks
// -subscriber's).
func (c *cli) findParked(ctx context.Context, d *database, eventID string) (*subscriptions.Subscriber, subscriptions.ParkedEvent, error) {
	names, err := c.subscribersFor(ctx, d)
	if err != nil {
		return nil, subscriptions.ParkedEvent{}, err
	}
	var (
		found []*subscriptions.Subscriber
		entry subscriptions.ParkedEvent
	)
	for _, name := range names {
		sub, err := d.subscriber(name, c.logger())
		if err != nil {
			return nil, entry, err
		}
		p, err := sub.GetParked(ctx, eventID)
		if errors.Is(err, subscriptions.ErrEventNotParked) {
			continue
		}
		if err != nil {
			return nil, entry, err
		}
		found, entry = append(found, sub), p
	}
	switch len(found) {
	case 0:
		if c.subscriber != "" {
			return nil, entry, fmt.Errorf("event %q is not parked for subscriber %q (parked list shows what is)", eventID, c.subscriber)
		}
		return nil, entry, fmt.Errorf("event %q is not parked for any subscriber (parked list shows what is)", eventID)
	case 1:
		return found[0], entry, nil
	}
	return nil, entry, fmt.Errorf("event %q is parked for %d subscribers: choose one with -subscriber", eventID, len(found))
}

func (c *cli) parkedShow(ctx context.Context, d *database, eventID string) error {
	_, p, err := c.findParked(ctx, d, eventID)
	if err != nil {
		return err
	}
	ev, evErr := d.events.GetEventByID(ctx, eventID)
	if c.json {
		out := map[string]any{"parked": p}
		if evErr != nil {
			out["event_error"] = evErr.Error()
		} else {
			out["event"] = ev
		}
		return c.printJSON(out)
	}
	rows := [][]string{
		{"subscriber", p.Subscriber}, {"event", p.EventID}, {"type", p.EventType}, {"position", strconv.FormatInt(p.Position, 10)},
		{"aggregate", p.AggregateID}, {"attempts", strconv.Itoa(p.Attempts)}, {"last failure", p.ParkedAt.UTC().Format(time.RFC3339Nano)},
	}
	if err := c.table([]string{"FIELD", "VALUE"}, rows); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "error:\n  %s\n", p.Error)
	if evErr != nil {
		fmt.Fprintf(c.stdout, "stored event: unavailable: %v\n", evErr)
		return nil
	}
	payload, err := json.MarshalIndent(ev.Payload, "  ", "  ")
	if err != nil {
		return fmt.Errorf("encode the payload of event %q: %w", eventID, err)
	}
	fmt.Fprintf(c.stdout, "stored event: created %s, sequence %d\npayload:\n  %s\n", ev.Created.UTC().Format(time.RFC3339Nano), ev.SequenceNo, payload)
	return nil
}

// operator names the person running the CLI, for the audit line.
func operator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	return "cli"
}

func (c *cli) parkedDiscard(ctx context.Context, d *database, eventID string) error {
	sub, p, err := c.findParked(ctx, d, eventID)
	if err != nil {
		return err
	}
	if err := c.confirm(fmt.Sprintf("Discard parked event %s (%s, position %d) of subscriber %q? It will never be processed.",
		p.EventID, p.EventType, p.Position, p.Subscriber)); err != nil {
		return err
	}
	if _, err := sub.DiscardParked(ctx, eventID, operator()); err != nil {
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"discarded": p})
	}
	fmt.Fprintf(c.stdout, "discarded: event %s of subscriber %q\n", p.EventID, p.Subscriber)
	return nil
}

func (c *cli) reset(ctx context.Context, d *database, name, positionArg string) error {
	position, err := strconv.ParseInt(positionArg, 10, 64)
	if err != nil || position < 0 {
		return usageError{fmt.Sprintf("reset: POSITION %q: want a whole number >= 0", positionArg)}
	}
	names, err := d.subscriberNames(ctx)
	if err != nil {
		return err
	}
	known := false
	for _, n := range names {
		known = known || n == name
	}
	if !known {
		return fmt.Errorf("no subscriber %q in this database (status lists them)", name)
	}
	current, err := d.checkpoints.Position(ctx, name)
	if err != nil {
		return err
	}
	if err := c.confirm(fmt.Sprintf("Reset subscriber %q from position %d to %d? Events after %d will be processed again.",
		name, current, position, position)); err != nil {
		return err
	}
	sub, err := d.subscriber(name, c.logger())
	if err != nil {
		return err
	}
	if err := sub.ResetCheckpoint(ctx, position); err != nil {
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"subscriber": name, "from": current, "position": position})
	}
	fmt.Fprintf(c.stdout, "reset: subscriber %q from position %d to %d\n", name, current, position)
	return nil
}

// migrate applies the module's migration files to the database
// (migrations.Migrate), or with -verify only checks that they are applied
// (migrations.Verify): the step a deployment runs, with a role allowed to
// create tables, before applications start with WithSchemaVerifyOnly.
func (c *cli) migrate(ctx context.Context) error {
	db, _, closeDB, err := openHandle(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer closeDB()
	if c.verify {
		if err := migrations.Verify(ctx, db); err != nil {
			return err
		}
		fmt.Fprintln(c.stdout, "schema is current")
		return nil
	}
	if err := migrations.Migrate(ctx, db); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, "schema migrated")
	return nil
}
