// Command subscriptions inspects and repairs the subscribers of a database
// when the application is down or not reachable: their status, their
// parked events, their checkpoints, and their pause.
//
//	subscriptions [-dsn DSN] [-json] [-yes] COMMAND [flags] [args]
//
//	status [-partitions]                every subscriber: position, head, lag, parked count, partitions
//	parked list [-subscriber S] [-type T] [-aggregate A] [-after P] [-limit N]
//	parked show [-subscriber S] EVENT_ID  one parked event with its stored event
//	parked discard [-subscriber S] EVENT_ID  remove it without processing (asks first)
//	reset SUBSCRIBER POSITION           set the checkpoint (asks first; not beyond the head)
//	pause SUBSCRIBER [-reason TEXT]     stop it in every process until resume (asks first)
//	resume SUBSCRIBER                   lift the pause (asks first)
//	repartition SUBSCRIBER -partitions N  change the partition count without a rebuild (asks first)
//	migrate [-verify]                   apply (or only check) the module's schema migrations
//
// Only migrate changes the schema: every other command opens the stores
// verify-only (WithSchemaVerifyOnly) and refuses a database whose schema
// is missing or older than this version's, naming each missing object,
// the migration file that adds it, and `subscriptions migrate`.
//
// The DSN comes from -dsn or SUBSCRIPTIONS_DSN: a Postgres URL or
// key=value DSN, or a SQLite file (a path, or file:PATH?params). The
// password is never printed. A partitioned subscriber is shown and named
// by its name, not by its partitions' checkpoint rows. -json prints JSON for scripts instead of
// tables; -yes skips the confirmations. Flags may come before or after
// the command's arguments.
//
// Tenants kept as schemas of one Postgres database (subscriptions.Group,
// docs/tenants.md): -schemas PATTERN runs a command over every schema
// matching PATTERN (path.Match) that has the checkpoint table, one
// schema at a time, with a TENANT column (and "tenant" in JSON);
// -tenant NAME picks one schema. A write (parked discard, reset, pause,
// resume, repartition, migrate) needs -tenant: a pattern never selects
// what a write changes. A pattern that matches no such schema is an
// error.
//
// Replaying a parked event needs the application's handler, so the CLI
// cannot do it: use the admin handler (admin.NewHandler)
// mounted in the application, or Subscriber.ReplayParked.
//
// Exit status: 0 on success, 1 on an error (each with a message on
// stderr), 2 on a usage error, 3 when a confirmation is declined.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

const usage = `usage: subscriptions [-dsn DSN] [-json] [-yes] COMMAND [flags] [args]

commands:
  status [-partitions]                      every subscriber: position, head, lag (events, time), parked count,
                                            partitions. A partitioned subscriber is one row: its position is the
                                            lowest partition checkpoint with events left (the head when all are
                                            caught up), its lag the events left in all partitions, its lag time
                                            the oldest one's age; -partitions (and -json) add each partition
  parked list [-subscriber S] [-type T] [-aggregate A] [-after P] [-limit N]
  parked show [-subscriber S] EVENT_ID      one parked event, with the stored event and its payload
  parked discard [-subscriber S] EVENT_ID   remove a parked event without processing it (asks first)
  parked replay ...                         not here: replay needs the application's handler (see below)
  reset SUBSCRIBER POSITION                 set a subscriber's checkpoint, every partition's if partitioned
                                            (asks first; refuses a position beyond the feed head)
  pause SUBSCRIBER [-reason TEXT]           stop it everywhere (every replica, partition and process) from its
                                            next batch until resume, across restarts (asks first)
  resume SUBSCRIBER                         lift the pause: its replicas go on from their checkpoints (asks first)
  repartition SUBSCRIBER -partitions N      change the partition count (0: unpartitioned) in place (asks first);
                                            needs the partitions at one position (docs/partitions.md)
  migrate [-verify]                         apply the module's schema migrations (migrations.Migrate);
                                            -verify only checks them (migrations.Verify), changing nothing.
                                            The only command that changes the schema: the others refuse a
                                            database whose schema is missing or older, naming what is missing

flags (anywhere on the line):
  -dsn DSN     database: a Postgres URL or key=value DSN, or a SQLite file (PATH or file:PATH?params);
               default $SUBSCRIPTIONS_DSN. The password is never printed.
  -json        print JSON for scripts instead of tables
  -yes         do not ask for confirmation
  -schemas P   tenants as Postgres schemas: each schema matching P (* ? [a-z]) that has a
               subscriber_checkpoints table, in turn, with a TENANT column; a write needs -tenant
  -tenant T    the schema T only; required by parked discard, reset, pause, resume, repartition, migrate

Replaying a parked event runs the application's handler, which this program does not have:
mount the admin handler (admin.NewHandler) in the application, or call
Subscriber.ReplayParked. Exit status: 0 ok, 1 error, 2 usage, 3 confirmation declined.
`

// Exit statuses.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitDeclined = 3
)

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// errDeclined is a confirmation answered with anything but yes.
var errDeclined = errors.New("not confirmed; nothing was changed (pass -yes to skip the question)")

// cli is one invocation: its flags, streams and, once opened, database.
type cli struct {
	dsn  string
	json bool
	yes  bool
	// schemas and tenant are -schemas and -tenant; targets the schemas
	// they select (resolveTenants).
	schemas string
	tenant  string
	targets []string
	// pool is the Postgres pool every tenant's stores share (closed by
	// closeTenantPool), from resolveTenants.
	pool       *gorm.DB
	closePool  func()
	subscriber string
	eventType  string
	aggregate  string
	after      int64
	limit      int
	verify     bool
	partitions bool
	reason     string
	// repartitionTo is repartition's -partitions N, -1 when not given.
	repartitionTo int

	stdin          io.Reader
	stdout, stderr io.Writer
	secrets        []string
}

// run is the whole program; main adds signals and the exit.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, limit: 100}
	err := c.dispatch(ctx, args, getenv)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "subscriptions: %s\n\n%s", c.scrub(ue.msg), usage)
		return exitUsage
	case errors.Is(err, errDeclined):
		fmt.Fprintf(stderr, "subscriptions: %v\n", err)
		return exitDeclined
	default:
		fmt.Fprintf(stderr, "subscriptions: %s\n", c.scrub(err.Error()))
		return exitError
	}
}

// flags parses args with the common flags and the given command's; flags
// may follow positional arguments. It returns the positional arguments.
func (c *cli) flags(name string, args []string, extra func(*flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.dsn, "dsn", c.dsn, "")
	fs.BoolVar(&c.json, "json", c.json, "")
	fs.BoolVar(&c.yes, "yes", c.yes, "")
	fs.StringVar(&c.schemas, "schemas", c.schemas, "")
	fs.StringVar(&c.tenant, "tenant", c.tenant, "")
	if extra != nil {
		extra(fs)
	}
	// A negative number is an argument (reset's POSITION), not a flag: it
	// ends a run of flags, and the value check reports it.
	var pos []string
	for len(args) > 0 {
		seg := args
		for i, a := range args {
			if len(a) > 1 && a[0] == '-' && a[1] >= '0' && a[1] <= '9' {
				seg = args[:i]
				break
			}
		}
		args = args[len(seg):]
		for len(seg) > 0 {
			if err := fs.Parse(seg); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return nil, err
				}
				return nil, usageError{err.Error()}
			}
			if fs.NArg() == 0 {
				break
			}
			pos = append(pos, fs.Arg(0))
			seg = fs.Args()[1:]
		}
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	return pos, nil
}

func (c *cli) dispatch(ctx context.Context, args []string, getenv func(string) string) error {
	// Global flags come before the command.
	rest, err := c.leadingFlags(args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usageError{"no command given"}
	}
	cmd, rest := rest[0], rest[1:]
	subscriberFlag := func(fs *flag.FlagSet) { fs.StringVar(&c.subscriber, "subscriber", "", "") }
	var pos []string
	switch cmd {
	case "help", "-h", "-help", "--help":
		return flag.ErrHelp
	case "status":
		pos, err = c.flags(cmd, rest, func(fs *flag.FlagSet) { fs.BoolVar(&c.partitions, "partitions", false, "") })
		if err == nil && len(pos) != 0 {
			err = usageError{fmt.Sprintf("status: takes no arguments, got %d", len(pos))}
		}
	case "parked":
		if len(rest) == 0 {
			return usageError{"parked: want list, show, discard (or replay)"}
		}
		sub := rest[0]
		rest = rest[1:]
		switch sub {
		case "list":
			pos, err = c.flags("parked list", rest, func(fs *flag.FlagSet) {
				subscriberFlag(fs)
				fs.StringVar(&c.eventType, "type", "", "")
				fs.StringVar(&c.aggregate, "aggregate", "", "")
				fs.Int64Var(&c.after, "after", 0, "")
				fs.IntVar(&c.limit, "limit", 100, "")
			})
			if err == nil && (c.limit < 1 || c.after < 0) {
				err = usageError{fmt.Sprintf("parked list: -limit %d must be at least 1 and -after %d not negative", c.limit, c.after)}
			}
		case "show", "discard":
			pos, err = c.flags("parked "+sub, rest, subscriberFlag)
			if err == nil && len(pos) != 1 {
				err = usageError{fmt.Sprintf("parked %s: want exactly one EVENT_ID, got %d arguments", sub, len(pos))}
			}
		case "replay":
			return errors.New("parked replay: replaying runs the application's event handler, which this program does not have.\n" +
				"Replay from the application: mount admin.NewHandler (its page has a Replay button, its API\n" +
				"POST .../api/subscribers/{name}/parked/{id}/replay) or call Subscriber.ReplayParked")
		default:
			return usageError{fmt.Sprintf("parked %s: unknown; want list, show or discard", sub)}
		}
		cmd = "parked " + sub
	case "reset":
		pos, err = c.flags(cmd, rest, nil)
		if err == nil && len(pos) != 2 {
			err = usageError{fmt.Sprintf("reset: want SUBSCRIBER POSITION, got %d arguments", len(pos))}
		}
	case "pause", "resume":
		var extra func(*flag.FlagSet)
		if cmd == "pause" {
			extra = func(fs *flag.FlagSet) { fs.StringVar(&c.reason, "reason", "", "") }
		}
		pos, err = c.flags(cmd, rest, extra)
		if err == nil && len(pos) != 1 {
			err = usageError{fmt.Sprintf("%s: want one SUBSCRIBER, got %d arguments", cmd, len(pos))}
		}
	case "repartition":
		pos, err = c.flags(cmd, rest, func(fs *flag.FlagSet) { fs.IntVar(&c.repartitionTo, "partitions", -1, "") })
		switch {
		case err != nil:
		case len(pos) != 1:
			err = usageError{fmt.Sprintf("repartition: want SUBSCRIBER -partitions N, got %d arguments", len(pos))}
		case c.repartitionTo < 0 || c.repartitionTo > subscriptions.MaxPartitions:
			err = usageError{fmt.Sprintf("repartition: -partitions N is required, from 0 (unpartitioned) to %d", subscriptions.MaxPartitions)}
		}
	case "migrate":
		pos, err = c.flags(cmd, rest, func(fs *flag.FlagSet) { fs.BoolVar(&c.verify, "verify", false, "") })
		if err == nil && len(pos) != 0 {
			err = usageError{fmt.Sprintf("migrate: takes no arguments, got %d", len(pos))}
		}
	default:
		return usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	if err != nil {
		return err
	}
	if c.dsn == "" {
		c.dsn = getenv("SUBSCRIPTIONS_DSN")
	}
	if strings.TrimSpace(c.dsn) == "" {
		return usageError{"no database: pass -dsn DSN or set SUBSCRIPTIONS_DSN"}
	}
	c.secrets = secretsOf(c.dsn)
	if err := c.checkTenantFlags(cmd); err != nil {
		return err
	}
	defer c.closeTenantPool()
	if err := c.resolveTenants(ctx, cmd); err != nil {
		return err
	}
	switch cmd {
	case "migrate":
		return c.migrate(ctx)
	case "status":
		return c.status(ctx)
	case "parked list":
		return c.parkedList(ctx)
	case "parked show":
		return c.parkedShow(ctx, pos[0])
	}
	// The writes: one database (one tenant, checkTenantFlags).
	return c.each(ctx, func(db *database) error {
		switch cmd {
		case "parked discard":
			return c.parkedDiscard(ctx, db, pos[0])
		case "pause":
			return c.pause(ctx, db, pos[0], c.reason)
		case "resume":
			return c.resume(ctx, db, pos[0])
		case "repartition":
			return c.repartition(ctx, db, pos[0], c.repartitionTo)
		default: // reset
			return c.reset(ctx, db, pos[0], pos[1])
		}
	})
}

// leadingFlags parses the common flags before the command.
func (c *cli) leadingFlags(args []string) ([]string, error) {
	fs := flag.NewFlagSet("subscriptions", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.dsn, "dsn", "", "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.BoolVar(&c.yes, "yes", false, "")
	fs.StringVar(&c.schemas, "schemas", "", "")
	fs.StringVar(&c.tenant, "tenant", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err.Error()}
	}
	return fs.Args(), nil
}

// confirm asks question on stderr and reads the answer from stdin; only
// "y" or "yes" confirms. -yes confirms without asking.
func (c *cli) confirm(question string) error {
	if c.yes {
		return nil
	}
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	var answer string
	if _, err := fmt.Fscanln(c.stdin, &answer); err != nil && answer == "" {
		fmt.Fprintln(c.stderr)
		return errDeclined
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return errDeclined
}
