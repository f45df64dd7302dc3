package pgxstore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions"
)

// ParkingLot is the managed parking lot of package subscriptions on the
// parked_events table of the module's Postgres schema (the WithSchema
// schema's, else the pool's search_path's), the table
// subscriptions.GormParkingLot uses: rows either lot writes, the other
// reads, replays and discards, and both can serve one database at once
// (a replay's row lock and its verified delete hold across them).
//
// Besides subscriptions.ParkingLot it has every capability of the GORM
// lot: subscriptions.ManagedParkingLot, ParkingLotPurger,
// DeliveredClearer, PartitionDeliveredClearer, ParkedCounter and
// OrderedParkingLot.
//
// It is safe for concurrent use. It does not own the pool: closing the
// pool is the caller's, after the lot's last call. Every call holds one
// connection of the pool at a time, for its statement or transaction; a
// call that joins a batch transaction (see Park) uses the batch's.
type ParkingLot struct {
	pool   *pgxpool.Pool
	schema string     // WithSchema's; "" for the pool's search_path
	stmt   parkingSQL // the statements, parked_events named in schema
}

var (
	_ subscriptions.ParkingLot                = (*ParkingLot)(nil)
	_ subscriptions.ManagedParkingLot         = (*ParkingLot)(nil)
	_ subscriptions.ParkingLotPurger          = (*ParkingLot)(nil)
	_ subscriptions.DeliveredClearer          = (*ParkingLot)(nil)
	_ subscriptions.PartitionDeliveredClearer = (*ParkingLot)(nil)
	_ subscriptions.ParkedCounter             = (*ParkingLot)(nil)
)

// NewParkingLot returns a parking lot on pool, first applying the
// module's migrations the database lacks (or, with WithSchemaVerifyOnly,
// only checking them). Build it on the same pool as the CheckpointStore,
// so that Park joins the batch transaction and commits with the
// checkpoint advance (see Park). The lot does not take ownership of pool.
func NewParkingLot(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*ParkingLot, error) {
	cfg := newConfig(opts)
	if err := ensureSchema(ctx, "NewParkingLot", pool, cfg); err != nil {
		return nil, err
	}
	l := &ParkingLot{pool: pool, schema: cfg.schema}
	l.stmt = newParkingSQL(l.schema)
	return l, nil
}

// Park records a poison event, or updates the entry already parked for
// it (its type, position, error, attempts, time and aggregate: the event
// may fail again after a checkpoint reset). It refuses, as every lot of
// package subscriptions does, an entry subscriptions.ValidateParked
// refuses. A zero ParkedAt is the current time; free text is stored as
// valid UTF-8 without NUL characters, which Postgres text cannot hold.
//
// When ctx carries a batch transaction of this package (TxFromContext) on
// the lot's database, the row is written through it, so the parking and
// the checkpoint advance past the event commit together: a crash between
// them can neither lose the event nor park it twice. A transaction on
// another database is ignored, as subscriptions.GormParkingLot ignores a
// foreign one: the row would land where List and Replay never look.
func (l *ParkingLot) Park(ctx context.Context, parked subscriptions.ParkedEvent) error {
	if err := subscriptions.ValidateParked(parked); err != nil {
		return fmt.Errorf("pgxstore: %w", err)
	}
	if parked.ParkedAt.IsZero() {
		parked.ParkedAt = time.Now()
	}
	_, err := l.querier(ctx).Exec(ctx, l.stmt.park, entryKey(parked.Subscriber, parked.EventID), subscriberKey(parked.Subscriber), parked.Subscriber, parked.EventID,
		storableText(parked.EventType), parked.Position, storableText(parked.Error), parked.Attempts,
		parked.ParkedAt.UTC(), storableText(parked.AggregateID))
	if err != nil {
		return fmt.Errorf("pgxstore: park event %q (position %d) for %q: %w", parked.EventID, parked.Position, parked.Subscriber, err)
	}
	return nil
}

// List returns the subscriber's parked events ordered by position (then
// event ID), never nil.
func (l *ParkingLot) List(ctx context.Context, subscriber string) ([]subscriptions.ParkedEvent, error) {
	out, err := l.selectParked(ctx, subscriber, subscriptions.ParkedFilter{})
	if err != nil {
		return nil, fmt.Errorf("pgxstore: list parked events of %q: %w", subscriber, err)
	}
	return out, nil
}

// CountParked returns how many events the subscriber has parked, through
// the index List uses (subscriptions.ParkedCounter).
func (l *ParkingLot) CountParked(ctx context.Context, subscriber string) (int, error) {
	var n int64
	if err := l.pool.QueryRow(ctx, l.stmt.count, subscriberKey(subscriber), subscriber).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgxstore: count parked events of %q: %w", subscriber, err)
	}
	return int(n), nil
}

// Purge deletes every event parked for subscriber, through the batch
// transaction in ctx when it is on the lot's database, as Park does
// (subscriptions.ParkingLotPurger; Subscriber.DeleteState runs it in the
// transaction that deletes the checkpoint).
func (l *ParkingLot) Purge(ctx context.Context, subscriber string) error {
	if _, err := l.querier(ctx).Exec(ctx, l.stmt.purge, subscriberKey(subscriber), subscriber); err != nil {
		return fmt.Errorf("pgxstore: purge parked events of %q: %w", subscriber, err)
	}
	return nil
}

// ClearDelivered removes the subscriber's entries with positions in
// (after, upTo], which a live batch has just handled
// (subscriptions.DeliveredClearer), through the batch transaction when
// ctx carries one on the lot's database (ClearsInBatch), else on its own.
// It is one statement on the (subscriber_key, position) index, which finds
// nothing unless the checkpoint was reset before a parked event (and
// leaves each queue it deletes from headed). An entry
// whose replay is running holds its row lock: the statement waits for the
// replay, which clears the entry or leaves it to this delete.
func (l *ParkingLot) ClearDelivered(ctx context.Context, subscriber string, after, upTo int64) error {
	if _, err := l.querier(ctx).Exec(ctx, l.stmt.clearRange, subscriberKey(subscriber), subscriber, after, upTo); err != nil {
		return fmt.Errorf("pgxstore: clear the parked events of %q delivered in positions %d-%d: %w", subscriber, after+1, upTo, err)
	}
	return nil
}

// ClearsInBatch reports whether ClearDelivered(ctx, ...) runs in the
// batch transaction ctx carries: true when it carries one of this package
// on the lot's database (see Park).
func (l *ParkingLot) ClearsInBatch(ctx context.Context) bool { return l.batchTx(ctx) != nil }

// ClearPartitionDelivered is ClearDelivered restricted to the entries
// whose aggregate falls in partition of partitions
// (subscriptions.PartitionDeliveredClearer): a partition's batch spans
// positions of other partitions' events, whose entries must stay. The
// range's entries are read (in the usual case none: only a reset makes a
// live batch cover a parked event), assigned their partition with
// subscriptions.PartitionOf, the one home of the hash, and the
// partition's deleted in one statement. An entry without an aggregate ID
// belongs to no partition and is left alone.
func (l *ParkingLot) ClearPartitionDelivered(ctx context.Context, subscriber string, partition, partitions int, after, upTo int64) error {
	what := func(err error) error {
		return fmt.Errorf("pgxstore: clear the parked events of %q (partition %d of %d) delivered in positions %d-%d: %w",
			subscriber, partition, partitions, after+1, upTo, err)
	}
	q := l.querier(ctx)
	rows, err := q.Query(ctx, l.stmt.rangeEntries, subscriberKey(subscriber), subscriber, after, upTo)
	if err != nil {
		return what(err)
	}
	var keys [][]byte
	var eventID, aggregateID string
	_, err = pgx.ForEachRow(rows, []any{&eventID, &aggregateID}, func() error {
		if subscriptions.PartitionOf(aggregateID, partitions) == partition {
			keys = append(keys, entryKey(subscriber, eventID))
		}
		return nil
	})
	if err != nil {
		return what(err)
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, l.stmt.clearKeys, subscriberKey(subscriber), subscriber, keys); err != nil {
		return what(err)
	}
	return nil
}

// querier is the batch transaction in ctx on the lot's database, else
// the pool.
func (l *ParkingLot) querier(ctx context.Context) querier {
	if tx := l.batchTx(ctx); tx != nil {
		return tx
	}
	return l.pool
}

// batchTx returns the transaction ctx carries (TxFromContext) when it was
// begun on the lot's own pool, nil otherwise: a transaction of another
// pool is ignored, even one on the same database, as
// subscriptions.GormParkingLot ignores a foreign handle's, and the write
// then commits on its own.
func (l *ParkingLot) batchTx(ctx context.Context) pgx.Tx {
	if h := txForPool(ctx, l.pool); h != nil {
		return h.Tx
	}
	return nil
}

// bySubscriber selects one subscriber's rows through the
// (subscriber_key, position) index: $1 is subscriberKey, $2 the name
// (the digest finds the rows, the name makes a digest collision harmless).
const bySubscriber = `subscriber_key = $1 AND subscriber = $2`

// byKey selects one entry through the primary key: $1 is entryKey, $2 the
// subscriber, $3 the event ID.
const byKey = `key = $1 AND subscriber = $2 AND event_id = $3`

// subscriberKey is parked_events.subscriber_key of a subscriber's rows:
// the SHA-256 digest of its name, which the table's trigger
// (parked_events_keys, migrations/schema/postgres/00001) computes for
// every row, and subscriptions.GormParkingLot computes to find them.
func subscriberKey(subscriber string) []byte {
	sum := sha256.Sum256([]byte(subscriber))
	return sum[:]
}

// entryKey is parked_events.key, the primary key: the SHA-256 digest of
// the subscriber name, a NUL byte and the event ID (neither may contain a
// NUL), as the trigger computes it.
func entryKey(subscriber, eventID string) []byte {
	sum := sha256.Sum256([]byte(subscriber + "\x00" + eventID))
	return sum[:]
}

// storableText makes free text (an error message, an event type)
// storable as Postgres text, as subscriptions.GormParkingLot does:
// invalid UTF-8 is replaced and NUL characters dropped.
func storableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}
