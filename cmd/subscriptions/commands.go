package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/migrations"
)

func (c *cli) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c.stderr, nil))
}

// auditLogger is logger with the operator (by=cli:<user>), for the
// commands whose library log lines are their audit (pause, resume,
// reset, repartition).
func (c *cli) auditLogger() *slog.Logger {
	return c.logger().With("by", operator())
}

// dbStatus is a subscriber's Status as the CLI shows it. Status.State is
// what a Run in the calling process is doing, always "stopped" here, so
// the CLI replaces it with what the database says: caught up, behind, or
// a checkpoint ahead of the head; Error is a read that failed. A paused
// name (Status.Paused, PausedAt, PauseReason) keeps that State in JSON,
// and its table row's STATE starts with "paused, ".
//
// A partitioned subscriber is one dbStatus: Status reads its partitions
// (Position is the lowest checkpoint of a partition with events still to
// handle, the head when every partition is caught up; Lag the events left
// in all partitions; LagSeconds the age of the oldest of them), and
// PartitionCheckpoints lists each partition.
type dbStatus struct {
	subscriptions.Status
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Partitions is the partition count, 0 for an unpartitioned subscriber.
	Partitions           int               `json:"partitions"`
	PartitionCheckpoints []partitionStatus `json:"partition_checkpoints,omitempty"`
	// OtherCheckpoints are partition rows of another partition count.
	OtherCheckpoints []string `json:"other_checkpoints,omitempty"`
}

// status prints every subscriber's status (Subscriber.Status, read from
// the database), a partitioned subscriber's partitions with -partitions
// or -json; over tenants (-schemas, -tenant) every tenant's, with a TENANT
// column.
func (c *cli) status(ctx context.Context) (err error) {
	out := []dbStatus{}
	// Over tenants, one that cannot be read (a schema not migrated yet,
	// say) is a row of its own, and the others are still shown; the
	// command then fails.
	var failed []error
	read := func(d *database) error {
		rows, err := c.statuses(ctx, d)
		out = append(out, rows...)
		return err
	}
	if !c.tenantMode() {
		if err := c.each(ctx, read); err != nil {
			return err
		}
	}
	for _, tenant := range c.targets {
		if err := c.inTenant(ctx, tenant, read); err != nil {
			out = append(out, dbStatus{Status: subscriptions.Status{Subscriber: "-", Tenant: tenant}, State: "error", Error: err.Error()})
			failed = append(failed, tenantError{tenant, err})
		}
	}
	defer func() {
		if len(failed) > 0 && err == nil {
			err = fmt.Errorf("status: %d of %d tenants could not be read:\n%w", len(failed), len(c.targets), errors.Join(failed...))
		}
	}()
	if c.json {
		return c.printJSON(map[string]any{"subscribers": out})
	}
	if len(out) == 0 {
		fmt.Fprintln(c.stdout, map[bool]string{false: "no subscribers in this database", true: "no subscribers in these tenants"}[c.tenantMode()])
		return nil
	}
	rows := make([][]string, 0, len(out))
	var notes []string
	for _, s := range out {
		state := s.State
		if s.Error != "" {
			state += ": " + s.Error
		}
		who := s.Subscriber // the notes' name for it, as the table shows it
		if s.Tenant != "" {
			who += " of tenant " + s.Tenant
		}
		if s.Paused {
			state = "paused, " + state
			p := admin.PauseState{PausedAt: s.PausedAt, Reason: s.PauseReason}
			notes = append(notes, fmt.Sprintf("paused: %s everywhere %s (`subscriptions resume %s%s` lifts it)", who, pausedSince(p), tenantArgs(s.Tenant), s.Subscriber))
		}
		parts := "-"
		if s.Partitions > 0 {
			parts = strconv.Itoa(s.Partitions)
		}
		parked := strconv.Itoa(s.Parked)
		if s.Held > 0 {
			parked += fmt.Sprintf(" (%d held)", s.Held)
		}
		rows = append(rows, c.tenantCell(s.Tenant, []string{s.Subscriber, strconv.FormatInt(s.Position, 10), strconv.FormatInt(s.Head, 10),
			strconv.FormatInt(s.Lag, 10), seconds(s.LagSeconds), parked, parts, state}))
		for _, p := range s.PartitionCheckpoints {
			pstate := "caught up"
			switch {
			case p.Position > s.Head:
				pstate = "checkpoint ahead of head"
			case p.Lag > 0:
				pstate = "behind"
			}
			rows = append(rows, c.tenantCell(s.Tenant, []string{p.Checkpoint, strconv.FormatInt(p.Position, 10), strconv.FormatInt(s.Head, 10),
				strconv.FormatInt(p.Lag, 10), seconds(p.LagSeconds), "-", fmt.Sprintf("%d of %d", p.Partition, s.Partitions), pstate}))
		}
		if len(s.OtherCheckpoints) > 0 {
			notes = append(notes, fmt.Sprintf("note: %s also has checkpoints of another partition count (%s ...), retired by a repartition or left by an earlier count, not used while it runs with %d (docs/partitions.md)",
				who, s.OtherCheckpoints[0], s.Partitions))
		}
	}
	if err := c.table(c.tenantCell("TENANT", []string{"SUBSCRIBER", "POSITION", "HEAD", "LAG", "LAG_TIME", "PARKED", "PARTITIONS", "STATE"}), rows); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(c.stdout, n)
	}
	return nil
}

// tenantCell puts tenant in front of a table row over tenants (-schemas,
// -tenant); row as it is otherwise.
func (c *cli) tenantCell(tenant string, row []string) []string {
	if !c.tenantMode() {
		return row
	}
	return append([]string{tenant}, row...)
}

// statuses reads the status of every subscriber of d.
func (c *cli) statuses(ctx context.Context, d *database) ([]dbStatus, error) {
	groups, err := d.groups(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]dbStatus, 0, len(groups))
	for _, g := range groups {
		sub, err := d.subscriber(g, c.logger())
		if err != nil {
			// A name this version refuses (written by hand?): its row says
			// why, the others are still shown.
			out = append(out, dbStatus{Status: subscriptions.Status{Subscriber: g.name, Tenant: d.tenant}, State: "error", Error: err.Error(), Partitions: g.partitions})
			continue
		}
		st, err := sub.Status(ctx)
		st.Tenant = d.tenant
		row := dbStatus{Status: st, Partitions: g.partitions, OtherCheckpoints: g.other}
		switch {
		case errors.Is(err, subscriptions.ErrCheckpointAhead):
			row.State = "checkpoint ahead of head"
		case err != nil:
			row.Subscriber, row.State, row.Error = g.name, "error", err.Error()
		case st.Lag > 0:
			row.State = "behind"
		default:
			row.State = "caught up"
		}
		if g.partitions > 0 && (c.json || c.partitions) && row.Error == "" {
			if row.PartitionCheckpoints, err = d.partitionStatuses(ctx, g, st.Head); err != nil {
				row.State, row.Error = "error", err.Error()
			}
		}
		out = append(out, row)
	}
	return out, nil
}

// subscribersFor returns -subscriber's subscriber (checked to exist; the
// name of a partitioned subscriber, not of one of its checkpoints) or
// every subscriber.
func (c *cli) subscribersFor(ctx context.Context, d *database) ([]*group, error) {
	groups, err := d.groups(ctx)
	if err != nil {
		return nil, err
	}
	if c.subscriber == "" {
		return groups, nil
	}
	g, err := findGroup(groups, c.subscriber)
	if err != nil {
		return nil, err
	}
	return []*group{g}, nil
}

// parkedList lists parked events, per subscriber (and tenant).
func (c *cli) parkedList(ctx context.Context) error {
	filter := subscriptions.ParkedFilter{EventType: c.eventType, AggregateID: c.aggregate, AfterPosition: c.after, Limit: c.limit}
	type listed struct {
		Tenant     string                   `json:"tenant,omitempty"`
		Subscriber string                   `json:"subscriber"`
		Page       subscriptions.ParkedPage `json:"page"`
	}
	all := []listed{}
	err := c.each(ctx, func(d *database) error {
		groups, err := c.subscribersFor(ctx, d)
		if err != nil {
			return err
		}
		for _, g := range groups {
			sub, err := d.subscriber(g, c.logger())
			if err != nil {
				return err
			}
			page, err := sub.ListParkedPage(ctx, filter)
			if err != nil {
				return err
			}
			all = append(all, listed{d.tenant, g.name, page})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(map[string]any{"parked": all})
	}
	var rows [][]string
	var more []string
	for _, l := range all {
		for _, p := range l.Page.Events {
			why := p.Error
			if p.HeldBy != "" {
				why = "held behind " + p.HeldBy
			}
			rows = append(rows, c.tenantCell(l.Tenant, []string{p.Subscriber, strconv.FormatInt(p.Position, 10), p.EventID, p.EventType, p.AggregateID,
				strconv.Itoa(p.Attempts), p.ParkedAt.UTC().Format(time.RFC3339), why}))
		}
		if l.Page.More {
			more = append(more, fmt.Sprintf("more parked events of %s: add -after %d", subject(l.Tenant, l.Subscriber), l.Page.NextAfter))
		}
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stdout, "no parked events")
		return nil
	}
	if err := c.table(c.tenantCell("TENANT", []string{"SUBSCRIBER", "POSITION", "EVENT_ID", "TYPE", "AGGREGATE", "ATTEMPTS", "LAST_FAILURE", "ERROR"}), rows); err != nil {
		return err
	}
	for _, m := range more {
		fmt.Fprintln(c.stdout, m)
	}
	return nil
}

// parkedHit is a subscriber (of a tenant) that parked an event, with the
// entry and, for show, the stored event.
type parkedHit struct {
	tenant string
	sub    *subscriptions.Subscriber
	entry  subscriptions.ParkedEvent
	ev     domain.EventEnvelope[any]
	evErr  error
}

// findParked returns the subscribers of d that parked eventID (only
// -subscriber's, checked to exist, when given).
func (c *cli) findParked(ctx context.Context, d *database, eventID string) ([]parkedHit, error) {
	groups, err := c.subscribersFor(ctx, d)
	if err != nil {
		return nil, err
	}
	var found []parkedHit
	for _, g := range groups {
		sub, err := d.subscriber(g, c.logger())
		if err != nil {
			return nil, err
		}
		p, err := sub.GetParked(ctx, eventID)
		if errors.Is(err, subscriptions.ErrEventNotParked) {
			continue
		}
		if err != nil {
			return nil, err
		}
		found = append(found, parkedHit{tenant: d.tenant, sub: sub, entry: p})
	}
	return found, nil
}

// oneParked is the one hit of found, or why there is not one.
func (c *cli) oneParked(found []parkedHit, eventID string) (parkedHit, error) {
	switch len(found) {
	case 0:
		where := "any subscriber"
		if c.subscriber != "" {
			where = fmt.Sprintf("subscriber %q", c.subscriber)
		}
		if c.tenantMode() && len(c.targets) > 1 {
			where += fmt.Sprintf(" of the %d tenants", len(c.targets))
		}
		return parkedHit{}, fmt.Errorf("event %q is not parked for %s (parked list shows what is)", eventID, where)
	case 1:
		return found[0], nil
	}
	var tenants []string
	for _, h := range found {
		if h.tenant != "" && !slices.Contains(tenants, h.tenant) {
			tenants = append(tenants, h.tenant)
		}
	}
	if len(tenants) > 1 {
		return parkedHit{}, fmt.Errorf("event %q is parked in %d tenants (%s): choose one with -tenant", eventID, len(tenants), strings.Join(tenants, ", "))
	}
	return parkedHit{}, fmt.Errorf("event %q is parked for %d subscribers: choose one with -subscriber", eventID, len(found))
}

func (c *cli) parkedShow(ctx context.Context, eventID string) error {
	var found []parkedHit
	err := c.each(ctx, func(d *database) error {
		hits, err := c.findParked(ctx, d, eventID)
		for i := range hits {
			hits[i].ev, hits[i].evErr = hits[i].sub.Event(ctx, eventID)
		}
		found = append(found, hits...)
		return err
	})
	if err != nil {
		return err
	}
	hit, err := c.oneParked(found, eventID)
	if err != nil {
		return err
	}
	p, ev, evErr := hit.entry, hit.ev, hit.evErr
	if c.json {
		out := map[string]any{"parked": p}
		if evErr != nil {
			out["event_error"] = evErr.Error()
		} else {
			out["event"] = ev
		}
		return c.printJSON(withTenant(hit.tenant, out))
	}
	var rows [][]string
	if hit.tenant != "" {
		rows = append(rows, []string{"tenant", hit.tenant})
	}
	rows = append(rows,
		[]string{"subscriber", p.Subscriber}, []string{"event", p.EventID}, []string{"type", p.EventType}, []string{"position", strconv.FormatInt(p.Position, 10)},
		[]string{"aggregate", p.AggregateID}, []string{"attempts", strconv.Itoa(p.Attempts)}, []string{"last failure", p.ParkedAt.UTC().Format(time.RFC3339Nano)},
	)
	if p.HeldBy != "" {
		rows = append(rows, []string{"held behind", p.HeldBy + " (replay or discard that one first)"})
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
	found, err := c.findParked(ctx, d, eventID)
	if err != nil {
		return err
	}
	hit, err := c.oneParked(found, eventID)
	if err != nil {
		return err
	}
	sub, p := hit.sub, hit.entry
	if err := c.confirm(fmt.Sprintf("Discard parked event %s (%s, position %d) of %s? It will never be processed.",
		p.EventID, p.EventType, p.Position, subject(d.tenant, p.Subscriber))); err != nil {
		return err
	}
	if _, err := sub.DiscardParked(ctx, eventID, operator()); err != nil {
		return err
	}
	if c.json {
		return c.printJSON(withTenant(d.tenant, map[string]any{"discarded": p}))
	}
	fmt.Fprintf(c.stdout, "discarded: event %s of %s\n", p.EventID, subject(d.tenant, p.Subscriber))
	return nil
}

func (c *cli) reset(ctx context.Context, d *database, name, positionArg string) error {
	position, err := strconv.ParseInt(positionArg, 10, 64)
	if err != nil || position < 0 {
		return usageError{fmt.Sprintf("reset: POSITION %q: want a whole number >= 0", positionArg)}
	}
	groups, err := d.groups(ctx)
	if err != nil {
		return err
	}
	g, err := findGroup(groups, name)
	if err != nil {
		return err
	}
	sub, err := d.subscriber(g, c.auditLogger())
	if err != nil {
		return err
	}
	// The admin handler's rule: not beyond the feed head, which would skip
	// every event appended until the feed gets there.
	if err := admin.CheckReset(ctx, sub, position); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	from, current := "", int64(0)
	if g.partitions > 0 {
		lo, hi := int64(-1), int64(0)
		for p := range g.partitions {
			pos := g.checkpoints[p]
			if lo < 0 || pos < lo {
				lo = pos
			}
			hi = max(hi, pos)
		}
		current = lo
		from = fmt.Sprintf("its %d partitions (at positions %d to %d)", g.partitions, lo, hi)
	} else {
		if current, err = d.checkpoints.Position(ctx, name); err != nil {
			return err
		}
		from = fmt.Sprintf("position %d", current)
	}
	if err := c.confirm(fmt.Sprintf("Reset %s from %s to %d? Events after %d will be processed again.",
		subject(d.tenant, name), from, position, position)); err != nil {
		return err
	}
	if err := sub.ResetCheckpoint(ctx, position); err != nil {
		return err
	}
	if c.json {
		out := map[string]any{"subscriber": name, "from": current, "position": position}
		if g.partitions > 0 {
			out["partitions"] = g.partitions
		}
		return c.printJSON(withTenant(d.tenant, out))
	}
	fmt.Fprintf(c.stdout, "reset: %s from %s to %d\n", subject(d.tenant, name), from, position)
	return nil
}

// migrate applies the module's migration files to the database
// (migrations.Migrate), or with -verify only checks that they are applied
// (migrations.Verify): the step a deployment runs, with a role allowed to
// create tables, before applications start with WithSchemaVerifyOnly.
// With -tenant it works in that schema (which must exist); -verify also
// checks every tenant -schemas selects, one after another.
// Over tenants -json prints {"schemas": [{"tenant", "schema"}...]}.
func (c *cli) migrate(ctx context.Context) error {
	if !c.tenantMode() {
		state, err := c.migrateOne(ctx, "")
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(map[string]any{"schema": state})
		}
		fmt.Fprintln(c.stdout, map[string]string{"current": "schema is current", "migrated": "schema migrated"}[state])
		return nil
	}
	var out []map[string]any
	for _, tenant := range c.targets {
		state, err := c.migrateOne(ctx, tenant)
		if err != nil {
			return tenantError{tenant, err}
		}
		out = append(out, map[string]any{"tenant": tenant, "schema": state})
		if !c.json {
			fmt.Fprintf(c.stdout, "tenant %q: %s\n", tenant, map[string]string{"current": "schema is current", "migrated": "schema migrated"}[state])
		}
	}
	if c.json {
		return c.printJSON(map[string]any{"schemas": out})
	}
	return nil
}

// migrateOne migrates (or verifies) the DSN's database, or tenant's
// schema (migrations.MigrateSchema, VerifySchema on the tenants' pool):
// "migrated" or "current".
func (c *cli) migrateOne(ctx context.Context, tenant string) (string, error) {
	migrate, verify := migrations.Migrate, migrations.Verify
	db := c.pool
	if tenant != "" {
		migrate = func(ctx context.Context, db *gorm.DB) error { return migrations.MigrateSchema(ctx, db, tenant) }
		verify = func(ctx context.Context, db *gorm.DB) error { return migrations.VerifySchema(ctx, db, tenant) }
	} else {
		h, _, closeDB, err := openHandle(ctx, c.dsn)
		if err != nil {
			return "", err
		}
		defer closeDB()
		db = h
	}
	if c.verify {
		if err := verify(ctx, db); errors.Is(err, migrations.ErrSchemaMismatch) {
			return "", fmt.Errorf("%w\n-verify changed nothing: `subscriptions migrate` applies the migrations", err)
		} else if err != nil {
			return "", err
		}
		return "current", nil
	}
	if err := migrate(ctx, db); err != nil {
		return "", err
	}
	return "migrated", nil
}
