package pgxstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
)

// DefaultNotifyChannel is the channel on which an EventStore NOTIFYs
// after every committed append unless WithNotifyChannel says otherwise.
// It is pgevents.DefaultNotifyChannel, the default of
// infrastructure.GormEventStore and of subscriptions.NewPostgresListener
// too, so that a listener of either backend is woken by appends of both.
const DefaultNotifyChannel = pgevents.DefaultNotifyChannel

// MaxIdentifierBytes bounds event IDs, aggregate IDs, event types and
// transaction IDs. Longer values are rejected with domain.ErrInvalidEvent
// rather than truncated, and the bound keeps every identifier inside what a
// Postgres B-tree index entry can hold. It is pgevents.MaxIdentifierBytes,
// infrastructure.MaxIdentifierBytes too: both stores refuse the same
// identifiers.
const MaxIdentifierBytes = pgevents.MaxIdentifierBytes

// EventStore is a domain.EventStore on Postgres through a pgx pool, on
// the events table that infrastructure.GormEventStore uses: the two
// append to and read one database at once, and each reads what the other
// wrote, byte for byte (payload and metadata are the same jsonb). It is
// safe for concurrent use, by any number of processes; the pool belongs
// to the caller, who closes it after the store's last call.
//
// # The ordered feed
//
// ReadAfter is a durable queue: a subscriber stores the last position it
// handled and never looks below it again, so a position must never
// become visible while a smaller one can still commit. Every append takes
// the transaction-scoped advisory lock of the GORM store
// (schema.LockKey("append", the events table's schema-qualified name))
// before its rows take positions (MAX(position)+1, in the INSERT, under
// READ COMMITTED), so appends to one table commit one at a time, in
// position order, whichever store makes them. ReadAfter is then a plain
// index range scan that only an in-flight append can delay: unrelated
// transactions never hold the feed back. The price is that appends to one
// table are serialized, the lock held through each commit's WAL flush.
// Within one store, concurrent appends that wait for the lock at the same
// time share one transaction (coalescing), so they share the lock and the
// flush while each keeps its own version check and outcome. The append,
// its validation, its coalescing and the decoding of rows are
// pgevents', which the GORM store runs too: both stores give one append
// the same answer.
//
// Each append runs pg_notify on its channel, with an empty payload, in
// its transaction, delivered at commit, for subscriptions.PostgresListener;
// a notification that cannot be queued never fails the append (the append
// runs again without it: subscribers poll anyway).
//
// The store also implements subscriptions.PartitionFeed and
// subscriptions.FeedIndex, in SQL.
type EventStore struct {
	pool *pgxpool.Pool
	// table is the events table (WithSchema's, or the search_path's),
	// resolved: its statements' name, its append lock, and its canonical
	// name for SharesFeed and ProbeHeads.
	table    pgevents.Table
	appender *pgevents.Appender // the append transaction, coalesced
}

var _ domain.EventStore = (*EventStore)(nil)

// WithNotifyChannel sets the channel on which an EventStore NOTIFYs after
// every committed append (default DefaultNotifyChannel); pass the same
// name to the listener (subscriptions.WithListenerChannel). The name is
// passed to pg_notify as a value, never spliced into SQL; an empty one,
// one longer than 63 bytes or one with a NUL byte could never be
// LISTENed to as given and is refused by NewEventStore. Other
// constructors ignore it.
func WithNotifyChannel(channel string) Option {
	return func(c *config) { c.channel = channel; c.channelSet = true }
}

// NewEventStore applies the module's schema migrations the database lacks
// (or, with WithSchemaVerifyOnly, checks them) and returns an event store
// on pool. It resolves the events table, WithSchema's or else the one the
// pool's search_path names, and the append lock from it, once: without
// WithSchema the pool's connections must all see the same events table.
// The lock is the table's however a store names it (pgevents.Table), so
// a store given WithSchema and one whose search_path selects the same
// schema keep one feed in order, and a GORM store of the table too. Every call holds one connection of the pool at a
// time, and concurrent appends of one store share one (coalesced).
func NewEventStore(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*EventStore, error) {
	cfg := newConfig(opts)
	channel := DefaultNotifyChannel
	if cfg.channelSet {
		channel = cfg.channel
	}
	if err := pgevents.CheckChannel(channel); err != nil {
		return nil, fmt.Errorf("pgxstore: NewEventStore: %w (WithNotifyChannel)", err)
	}
	if err := ensureSchema(ctx, "NewEventStore", pool, cfg); err != nil {
		return nil, err
	}
	// The table and lock of infrastructure.GormEventStore, resolved as it
	// does.
	qualified, err := resolveEventsTable(ctx, pool, cfg.schema)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: NewEventStore: %w", err)
	}
	table, err := pgevents.NewTable(cfg.schema, qualified)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: NewEventStore: resolve the events table: %w", err)
	}
	s := &EventStore{pool: pool, table: table}
	s.appender = pgevents.NewAppender(table, channel, s.withConn)
	return s, nil
}

// withConn is the store's pgevents.ConnFunc: f runs on a connection of
// the pool, which the Appender hands back outside any transaction.
func (s *EventStore) withConn(ctx context.Context, f func(*pgx.Conn)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release()
	f(conn.Conn())
	return nil
}

// Append stores events for one aggregate atomically; see
// domain.EventStore. Nothing is stored when any event is invalid or the
// version check fails. It keeps no reference to events once it returns,
// even when it gives up on an append that may still commit: the caller
// may reuse them.
func (s *EventStore) Append(ctx context.Context, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	return wrap(s.append(ctx, aggregateID, expectedVersion, events))
}

func (s *EventStore) append(ctx context.Context, aggregateID string, expectedVersion int, events []domain.EventEnvelope[any]) error {
	// What can be checked without the database is checked first, so bad
	// input never takes the append lock. The version check and sequence
	// numbers are checked again in the database.
	given, err := pgevents.PrepareAppend(aggregateID, expectedVersion, -1, events)
	if err != nil {
		return err
	}
	if len(events) == 0 {
		// Nothing to store, but the version check is still answered.
		if expectedVersion == -1 {
			return nil
		}
		current, err := s.currentVersion(ctx, aggregateID)
		if err != nil {
			return err
		}
		_, err = pgevents.PrepareAppend(aggregateID, expectedVersion, current, nil)
		return err
	}
	return s.appender.Append(ctx, aggregateID, expectedVersion, events, given)
}

// AppendTx stores events for one aggregate atomically inside tx, a
// transaction of the caller's on the store's database (begun on any pool
// or connection, or a handler's batch transaction from TxFromContext),
// so that the events commit or roll back with the caller's other writes:
// the state a command changed and the events it raised, in one unit of
// work. It runs as Append does (the same validation, version check, the
// append lock that keeps the feed in order, NOTIFY), under a savepoint:
// when it is refused (domain.ErrConcurrencyConflict, a stored event ID,
// domain.ErrInvalidEvent) nothing of it is left in tx and the caller's
// transaction goes on. The events become visible, and subscribers are
// woken, when the caller commits.
//
// tx must run at READ COMMITTED (pgx.TxOptions{IsoLevel: pgx.ReadCommitted},
// the server's default); another level is refused with an error wrapping
// pgevents.ErrNotReadCommitted. The append lock is held from the call
// until the caller's transaction ends, and every other append to the
// table waits for it meanwhile: end the transaction soon after. AppendTx
// is never coalesced with other appends. It keeps no reference to events
// or tx once it returns.
func (s *EventStore) AppendTx(ctx context.Context, tx pgx.Tx, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	if tx == nil {
		return errors.New("pgxstore: AppendTx: nil transaction")
	}
	given, err := pgevents.PrepareAppend(aggregateID, expectedVersion, -1, events)
	if err != nil {
		return wrap(err)
	}
	if len(events) == 0 {
		if expectedVersion == -1 {
			return nil
		}
		current, err := currentVersion(ctx, tx, s.table, aggregateID)
		if err != nil {
			return err
		}
		_, err = pgevents.PrepareAppend(aggregateID, expectedVersion, current, nil)
		return wrap(err)
	}
	return wrap(s.appender.AppendInTx(ctx, tx, aggregateID, expectedVersion, events, given))
}

// wrap prefixes an error with the package's name.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("pgxstore: %w", err)
}

// query reads whole events on the pool; what names the read in the error.
func (s *EventStore) query(ctx context.Context, what, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	return queryEvents(ctx, s.pool, s.table, what, clause, args...)
}

// queryEvents reads whole events of table through q (the pool, or a
// batch's transaction): table.SelectEvents followed by clause; what
// names the read in the error.
func queryEvents(ctx context.Context, q querier, table pgevents.Table, what, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	rows, err := q.Query(ctx, table.SelectEvents()+clause, args...)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	out, err := collectEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	return out, nil
}

// collectEvents decodes the rows of a SelectEvents query and closes them
// (pgevents.ScanEnvelopes).
func collectEvents(rows pgx.Rows) ([]domain.EventEnvelope[any], error) {
	return pgevents.ScanEnvelopes(rows)
}

// GetEvents returns every event of the aggregate in sequence order.
func (s *EventStore) GetEvents(ctx context.Context, aggregateID string) ([]domain.EventEnvelope[any], error) {
	return s.GetEventsRange(ctx, aggregateID, -1, -1)
}

// GetEventsFromVersion returns the aggregate's events with sequence
// number >= fromVersion (-1 means 1).
func (s *EventStore) GetEventsFromVersion(ctx context.Context, aggregateID string, fromVersion int) ([]domain.EventEnvelope[any], error) {
	return s.GetEventsRange(ctx, aggregateID, fromVersion, -1)
}

// GetEventsRange returns the aggregate's events with sequence numbers in
// [fromVersion, toVersion]; -1 means 1 for fromVersion and "to the end"
// for toVersion.
func (s *EventStore) GetEventsRange(ctx context.Context, aggregateID string, fromVersion, toVersion int) ([]domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return nil, wrap(err)
	}
	from, to, err := pgevents.CheckVersionRange(aggregateID, fromVersion, toVersion)
	if err != nil {
		return nil, wrap(err)
	}
	what := fmt.Sprintf("read aggregate %q versions %d..%d", aggregateID, fromVersion, toVersion)
	if to < 0 {
		return s.query(ctx, what, "WHERE aggregate_id = $1 AND sequence_no >= $2 ORDER BY sequence_no", aggregateID, from)
	}
	return s.query(ctx, what, "WHERE aggregate_id = $1 AND sequence_no BETWEEN $2 AND $3 ORDER BY sequence_no", aggregateID, from, to)
}

// GetEventByID returns one event or an error wrapping
// domain.ErrEventNotFound.
func (s *EventStore) GetEventByID(ctx context.Context, eventID string) (domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("event ID", eventID); err != nil {
		return domain.EventEnvelope[any]{}, wrap(err)
	}
	events, err := s.query(ctx, fmt.Sprintf("read event %q", eventID), "WHERE id = $1", eventID)
	if err != nil {
		return domain.EventEnvelope[any]{}, err
	}
	if len(events) == 0 {
		return domain.EventEnvelope[any]{}, fmt.Errorf("pgxstore: %w: event ID %q", domain.ErrEventNotFound, eventID)
	}
	return events[0], nil
}

// GetEventsByTransactionID returns the transaction's events ordered by
// aggregate ID (by its bytes, whatever the column's collation), then
// sequence number.
func (s *EventStore) GetEventsByTransactionID(ctx context.Context, transactionID string) ([]domain.EventEnvelope[any], error) {
	if err := pgevents.CheckIdentifier("transaction ID", transactionID); err != nil {
		return nil, wrap(err)
	}
	return s.query(ctx, fmt.Sprintf("read transaction %q", transactionID),
		`WHERE transaction_id = $1 ORDER BY aggregate_id COLLATE "C", sequence_no`, transactionID)
}

// GetCurrentVersion returns the aggregate's last sequence number, 0 when
// it does not exist.
func (s *EventStore) GetCurrentVersion(ctx context.Context, aggregateID string) (int, error) {
	v, err := s.currentVersion(ctx, aggregateID)
	return v, wrap(err)
}

func (s *EventStore) currentVersion(ctx context.Context, aggregateID string) (int, error) {
	return currentVersion(ctx, s.pool, s.table, aggregateID)
}

// currentVersion reads the aggregate's version in table through q.
func currentVersion(ctx context.Context, q querier, table pgevents.Table, aggregateID string) (int, error) {
	if err := pgevents.CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return 0, err
	}
	var version int
	if err := q.QueryRow(ctx, "SELECT COALESCE(MAX(sequence_no), 0) FROM "+table.Name()+" WHERE aggregate_id = $1", aggregateID).Scan(&version); err != nil {
		return 0, fmt.Errorf("read version of aggregate %q: %w", aggregateID, err)
	}
	return version, nil
}

// ReadAfter returns up to limit committed events (all when limit <= 0)
// with Position > afterPosition, in position order: an index range scan
// that only an in-flight append can delay (see the type's documentation).
func (s *EventStore) ReadAfter(ctx context.Context, afterPosition int64, limit int) ([]domain.EventEnvelope[any], error) {
	what := fmt.Sprintf("read feed after position %d", afterPosition)
	if limit > 0 {
		return s.query(ctx, what, "WHERE position > $1 ORDER BY position LIMIT $2", afterPosition, limit)
	}
	return s.query(ctx, what, "WHERE position > $1 ORDER BY position", afterPosition)
}

// HeadPosition returns the highest committed position, 0 when empty.
func (s *EventStore) HeadPosition(ctx context.Context) (int64, error) {
	var head int64
	if err := s.pool.QueryRow(ctx, "SELECT COALESCE(MAX(position), 0) FROM "+s.table.Name()).Scan(&head); err != nil {
		return 0, fmt.Errorf("pgxstore: read feed head: %w", err)
	}
	return head, nil
}

// ProbeHeads returns the feed head of each of stores (what each one's
// HeadPosition would return), read in one statement on this store's pool:
// subscriptions.Group's probe of the tenants of one database
// (subscriptions.HeadProber), one index lookup per store and one
// connection, however many stores there are. stores must be EventStores
// of this package on this store's database (each reads the events table
// of its WithSchema or its pool's search_path); any other store is an error wrapping
// errors.ErrUnsupported, and the caller then asks each store on its own.
func (s *EventStore) ProbeHeads(ctx context.Context, stores []domain.EventStore) ([]int64, error) {
	tables := make([]string, len(stores))
	for i, store := range stores {
		e, ok := store.(*EventStore)
		if !ok || e == nil {
			return nil, fmt.Errorf("pgxstore: probe heads: store %d (%T) is not a pgxstore.EventStore: %w", i, store, errors.ErrUnsupported)
		}
		tables[i] = e.table.Qualified()
	}
	if len(tables) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, pgevents.HeadsQuery(tables))
	if err != nil {
		return nil, fmt.Errorf("pgxstore: probe heads of %d stores: %w", len(tables), err)
	}
	defer rows.Close()
	heads, err := pgevents.ScanHeads(len(tables), rows.Next, rows.Scan)
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("pgxstore: probe heads of %d stores: %w", len(tables), err)
	}
	return heads, nil
}

// Close is a no-op: the pool belongs to the caller, who closes it, as a
// GormEventStore's *gorm.DB does.
func (s *EventStore) Close() error { return nil }

// partitionHash is subscriptions.PartitionOf's hash of aggregate_id in
// SQL (pgevents.PartitionHash), as the GORM store's Postgres reads
// compute it.
const partitionHash = pgevents.PartitionHash

// ReadPartitionAfter returns up to limit events (all when limit <= 0) of
// partition p of n (subscriptions.PartitionOf) with Position >
// afterPosition, in position order (subscriptions.PartitionFeed).
func (s *EventStore) ReadPartitionAfter(ctx context.Context, afterPosition int64, limit, p, n int) ([]domain.EventEnvelope[any], error) {
	if err := checkPartition(p, n); err != nil {
		return nil, err
	}
	sqlLimit := int64(limit)
	if limit <= 0 {
		sqlLimit = 1<<63 - 1
	}
	return s.query(ctx, fmt.Sprintf("read partition %d of %d after position %d", p, n, afterPosition),
		"WHERE position > $1 AND mod("+partitionHash+", $2) = $3 ORDER BY position LIMIT $4", afterPosition, n, p, sqlLimit)
}

// CountPartitionAfter counts the events of partition p of n in (after,
// head] (subscriptions.PartitionFeed).
func (s *EventStore) CountPartitionAfter(ctx context.Context, after, head int64, p, n int) (int64, error) {
	if err := checkPartition(p, n); err != nil {
		return 0, err
	}
	var count int64
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.table.Name()+" WHERE position > $1 AND position <= $2 AND mod("+partitionHash+", $3) = $4",
		after, head, n, p).Scan(&count); err != nil {
		return 0, fmt.Errorf("pgxstore: count partition %d of %d after position %d: %w", p, n, after, err)
	}
	return count, nil
}

// checkPartition refuses a partition that no aggregate is in, rather than
// dividing by zero in SQL.
func checkPartition(p, n int) error {
	if n < 1 || p < 0 || p >= n {
		return fmt.Errorf("pgxstore: partition %d of %d: the partition must be in [0, n) with n >= 1", p, n)
	}
	return nil
}

// ReadAggregatesAfter returns the positions and aggregate IDs of up to
// limit events past afterPosition (all when limit <= 0), in position
// order: the feed without payloads (subscriptions.FeedIndex).
func (s *EventStore) ReadAggregatesAfter(ctx context.Context, afterPosition int64, limit int) ([]int64, []string, error) {
	sqlLimit := int64(limit)
	if limit <= 0 {
		sqlLimit = 1<<63 - 1
	}
	rows, err := s.pool.Query(ctx, "SELECT position, aggregate_id FROM "+s.table.Name()+" WHERE position > $1 ORDER BY position LIMIT $2", afterPosition, sqlLimit)
	if err != nil {
		return nil, nil, fmt.Errorf("pgxstore: read the feed's aggregates after position %d: %w", afterPosition, err)
	}
	defer rows.Close()
	positions, aggregates := []int64{}, []string{}
	for rows.Next() {
		var pos int64
		var agg string
		if err := rows.Scan(&pos, &agg); err != nil {
			return nil, nil, fmt.Errorf("pgxstore: read the feed's aggregates after position %d: %w", afterPosition, err)
		}
		positions, aggregates = append(positions, pos), append(aggregates, agg)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("pgxstore: read the feed's aggregates after position %d: %w", afterPosition, err)
	}
	return positions, aggregates, nil
}

// ReadPositions returns the events at positions, in position order; a
// position without an event is left out (subscriptions.FeedIndex).
func (s *EventStore) ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error) {
	return readPositions(ctx, s.pool, s.table, positions)
}

// readPositions is ReadPositions of table through q.
func readPositions(ctx context.Context, q querier, table pgevents.Table, positions []int64) ([]domain.EventEnvelope[any], error) {
	if len(positions) == 0 {
		return []domain.EventEnvelope[any]{}, nil
	}
	// One bigint[] literal, as the GORM store passes it: one statement
	// text whatever the number of positions.
	return queryEvents(ctx, q, table, fmt.Sprintf("read %d events at positions %d...", len(positions), positions[0]),
		"WHERE position = ANY($1::bigint[]) ORDER BY position", pgevents.PositionsArray(positions))
}
