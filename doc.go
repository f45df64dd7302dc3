// Package subscriptions runs event handlers as crash-safe background
// subscribers over an event store's global ordered feed.
//
// # The model
//
// An event store (package domain's EventStore; package infrastructure has a
// memory and a GORM implementation) gives every committed event a Position
// in one global, cross-aggregate order, and its ReadAfter method reads the
// feed past a position. A Subscriber treats that feed as a durable queue
// and remembers exactly one number per name: its checkpoint, the position
// it has processed up to. Each cycle acquires the checkpoint from a
// CheckpointStore and reads a batch of events past it, runs the Handler
// for each event in feed order and advances the checkpoint. Which of the
// two comes first is the stores' choice (reading first keeps an idle poll
// free of transactions; the Postgres stores also read inside the lock, in
// one round trip); either way the batch runs only when the checkpoint it
// holds is the position its events were read after, and reads again from
// the real position otherwise. Crash recovery and normal startup are
// therefore the same code path: a new process reads the checkpoint and
// carries on.
//
// # Delivery guarantees
//
// With a GormCheckpointStore each batch is one database transaction. A
// handler that writes its projection through that transaction
// (TxFromContext for GORM, SQLTxFromContext for database/sql and sqlc)
// commits atomically with the checkpoint advance:
// exactly-once, for writes to the same database. Anything else a handler
// does (HTTP calls, messages, writes elsewhere) is at-least-once: a batch
// that fails or crashes is delivered again. MemoryCheckpointStore offers
// at-least-once only.
//
// On Postgres, any number of processes may run the same subscriber: the
// checkpoint row is locked with FOR UPDATE SKIP LOCKED, so one replica
// processes each batch and the others skip, and no event is processed
// twice. SQLite serializes writers, so it is for one process.
//
// # Failures
//
// A failing handler never blocks the events ahead of it: the events before
// it in the batch commit at once. The failing event is retried after the
// poll interval forever, or, with WithParkingLot, retried with a doubling
// backoff (no transaction is held while waiting) and then parked — recorded
// with its error and skipped — so that the events behind it keep flowing.
// It is parked after 1 + WithMaxRetries attempts in all: the checkpoint
// store counts each attempt before it runs, so replicas and restarts
// continue one count, and an event whose handler crashes the process is
// parked too, without running again, after one uncounted first crash
// (docs/design.md, "Attempt counts", says how, why the first crash is not
// counted, and what a CheckpointStore of your own gets).
// Parked events are listed with ListParked and re-run with ReplayParked;
// a replay started while another replay of the same event runs is refused
// with ErrReplayInProgress, on every ParkingLot, so the handler runs once
// (a discard meanwhile is refused the same way). With a ManagedParkingLot
// they can also be paged and filtered, replayed in bulk and discarded;
// package admin and cmd/subscriptions put these calls in front of
// operators.
//
// By default the events after a parked one are handled, its aggregate's
// too, and a replay applies it after them. WithOrderedParking keeps each
// aggregate in order instead: every later event of a parked event's
// aggregate that the subscriber reaches is parked behind it, held
// (ParkedEvent.HeldBy names the queue's head) and handed to no handler,
// while other aggregates go on, until the head succeeds: by ReplayParked,
// which then replays the queue in order and stops at the first failure
// (which heads the queue from then on), or by its delivery after a reset.
// Discarding the head makes the next entry the head; a replay of a held
// entry is refused (ErrParkedBehindHead). Holding is written in the
// batch's transaction, as parking is, and costs nothing while nothing is
// parked: the run loop looks the queues up, in one indexed read, only in
// a batch that does not follow its own (its first, or one after a wait,
// another replica's turn or a failure).
//
// A batch whose handlers all succeeded can still fail to commit because of
// an event: a deferred constraint, a transaction a handler left failed (on
// Postgres one failed statement aborts it) or kept open past
// idle_in_transaction_session_timeout, a handler that tried to end the
// batch transaction. Such a commit failure takes the same path: the
// batch's events run again one per transaction, those before the culprit
// commit, and the culprit is retried and parked (or, without a parking
// lot, halts the checkpoint). A handler that fails only because an earlier
// handler left the transaction failed (Postgres "current transaction is
// aborted") is not blamed either: the events run one per transaction to
// find the culprit. On SQLite (both drivers) a statement that rolls back
// the whole transaction (a trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK,
// some disk-full or I/O errors) is found out when it fails, or at the
// latest when its handler returns, even if the handler swallowed the
// error: its event is the culprit, and no later statement of the batch —
// of that handler, of the handlers after it, or the checkpoint update —
// runs outside the transaction. A COMMIT that fails leaves no transaction
// open on the pooled connection: it is rolled back, or the connection is
// discarded. A failure of the package's own statements in the batch (the
// checkpoint update, the removal of delivered parked entries: a missing
// table, a permission, a read-only server) and a commit that fails for
// another reason — a lost connection, a server restart, a serialization
// failure — say nothing about the events: the whole batch is retried after
// the poll interval and nothing is parked for it.
//
// With this package's parking lots, a parked entry does not outlive its
// event's successful handling. After
// ResetCheckpoint moves the checkpoint before a parked event, the
// subscriber delivers it again: a success removes the entry, a failure
// parks it again; until then ReplayParked refuses it
// (ErrParkedAfterCheckpoint), since the event would be handled twice. A
// GormParkingLot on the checkpoint store's database removes the entry in
// the batch's transaction. A lot that cannot join it (a
// MemoryParkingLot, or a GormParkingLot on another database) removes it
// right after the batch commits, never before, so a failed commit keeps
// the entry of the event it did not handle; in the moment between the
// commit and the removal (or if the process dies there, or the removal
// fails, which is logged) the entry is still listed although the event was
// handled.
//
// Database outages are logged and retried; Run returns only on
// cancellation, on an event store without a global ordered feed, or on a
// name whose checkpoints were written for another partition count
// (ErrPartitionsChanged).
//
// # Partitions
//
// WithPartitions(n) splits the feed by aggregate: partition PartitionOf(id,
// n) of each event's aggregate ID, a hash that is the same in Go and in
// Postgres SQL and fixed across versions. Each partition is the ordinary
// per-name cycle above over the partition's events, with a checkpoint row
// of its own (named "<name>/partition-<p>-of-<n>"), so everything said
// here holds per partition: exactly-once through TxFromContext, retries and
// parking (parked under the subscriber's own name), replicas taking turns
// with FOR UPDATE SKIP LOCKED. Events of one aggregate are handled in feed
// order; events of different partitions may be handled out of global
// order. WithConcurrency(k) runs k partitions at once in one process, and
// every replica of the name shares the partitions: a worker takes any
// partition with work whose checkpoint it can lock, and a dead replica's
// partitions are taken over within a poll interval. Lag is the number of
// events not yet handled, summed over the partitions (PartitionLags per
// partition); ResetCheckpoint and ResetCheckpointWith move every
// partition in one transaction, WaitCaughtUp waits for every partition and
// DeleteState deletes them all. An idle partitioned subscriber costs two
// statements per poll interval whatever n is. The partition count is
// recorded with the checkpoints: a Run with another n is refused with
// ErrPartitionsChanged, and the first partitioned Run of a name that ran
// unpartitioned starts every partition at its checkpoint. Repartition
// changes n (to or from unpartitioned too) while replicas run, in one
// transaction that first brings every partition to the highest
// checkpoint: nothing is skipped or handled twice, each aggregate stays in
// feed order, and replicas on the old n stop with ErrPartitionsChanged.
// See docs/partitions.md.
//
// # Batch handlers
//
// WithBatchHandler hands each batch to one call (a multi-row upsert, say),
// inside the batch transaction. A batch it fails is rolled back whole and
// its events are then handled one at a time, so the failure handling above
// applies to exactly the failing event. A rebuild writes at COPY's speed
// through the same transaction with CopyFrom (on pgx's backend, the
// pgx.Tx's CopyFrom).
//
// # Wake-ups
//
// An idle subscriber polls every poll interval, at the cost of two indexed
// reads. WithWakeSignal makes it react within milliseconds instead:
// InProcessNotifier with NotifyingEventStore in one process, or
// PostgresListener, which LISTENs for the NOTIFY that GormEventStore sends
// on every commit, across processes. Signals are never load-bearing: a
// missed one costs at most a poll interval.
//
// # Rebuilds
//
// ResetCheckpointWith empties a projection (or does any other cleanup the
// application needs) and moves the checkpoint in one transaction that
// holds off every replica's batches, so no batch lands between the two.
// A blue/green rebuild runs the new version under a new name into its own
// table while the old one serves, waits with WaitCaughtUp, and switches
// readers with SwitchOver: the old version paused everywhere, the new one
// past its checkpoint, then the application's switch in a transaction of
// its own, so that no reader ever sees the projection go back; the old
// name is retired with DeleteState. docs/rebuilds.md has both procedures.
//
// # Replays and live traffic
//
// DeliveryFrom tells a handler why it is given an event, so that it
// updates its projection on every delivery and keeps a side effect
// outside the batch transaction (an email, a webhook) for live ones.
// After ResetCheckpoint or ResetCheckpointWith moves a checkpoint back to
// P, the events from P up to the checkpoint it had are re-deliveries
// (DeliveryRedelivery), and a second reset during the rebuild keeps the
// highest earlier checkpoint; with WithFirstRunCatchUp, a name's first
// start delivers the history up to the head as catch-up (the new version
// of a blue/green rebuild); ReplayParked's call is a parked replay. The
// marks are recorded with the checkpoints, in the reset's transaction or
// before the first start handles anything, so every replica, partition
// and restart tells the same, and a batch ends where the nature changes,
// so that each handler call has one. Repartition during a rebuild keeps
// them: its catch-up re-delivers under each old partition's mark, and the
// new partitions re-deliver up to the lowest of them (past it, an event
// an old partition had handled comes live again: a side effect may
// repeat, none is skipped). Everything else is live, a retry of a failed
// attempt included.
//
// # Pausing a name
//
// Pause stops a subscriber name everywhere, durably: no replica or
// partition of it, in any process, handles anything from its next batch
// until Resume, and none commits after Pause returned. It is recorded with
// the checkpoints (this package's stores), so restarts keep it.
//
// # Shutdown
//
// When Run's context is cancelled, the batch in flight drains: its
// handlers finish and it commits before Run returns. Handler contexts
// are not cancelled by default, so a hung handler blocks shutdown.
// WithShutdownGrace bounds the drain: once it runs out the handler's
// context is cancelled (cause ErrShutdownGrace), the batch rolls back and
// its events are delivered again after a restart; it rolls back whatever
// the handler then returns, nil included, and no later handler of the
// batch runs. WithHandlerTimeout
// gives every handler call a deadline (cause ErrHandlerTimeout); a call
// that ends on it has failed and is retried or parked like any failure.
// Both only stop handlers that honour their context.
//
// # Observability
//
// Status reports a subscriber's state, its lag in events and in time, its
// parked events and its last failure; Healthy turns them into a readiness
// check. Metrics and spans go through the OpenTelemetry API to the
// providers of WithMeterProvider and WithTracerProvider (the globals by
// default, which do nothing until the application installs an SDK).
// TracingEventStore records the appending request's trace context in each
// event's metadata, and the handler spans link to it. docs/observability.md
// names every metric and span.
//
// # Schema
//
// The GORM stores' tables are defined by the ordered SQL files of package
// migrations, which the constructors apply when the database lacks any
// and which a migration tool can apply instead; WithSchemaVerifyOnly
// starts a store without DDL.
//
// # Connections
//
// Every path of this package holds at most one connection of the
// database's pool at a time and never waits for another while it holds
// one, so a pool of any size, down to one connection, makes progress
// however many subscribers, replicas, partitions, appends and operator
// calls share it: the pool bounds how many of them run at once, and the
// rest wait their turn instead of deadlocking. At most, at once:
//
//   - a subscriber: one, its batch (its attempt record is written on the
//     batch's own connection, see docs/design.md, "Attempt counts");
//   - a partitioned subscriber: one per worker (WithConcurrency) and one
//     for the coordinator's reads;
//   - an append: one (the concurrent appends of one GormEventStore share
//     it);
//   - Lag, Status, Healthy, ListParked, ReplayParked, ResetCheckpoint,
//     ResetCheckpointWith, DeleteState, Repartition (its catch-up reads
//     the feed in its transaction) and the admin calls: one each (a
//     reset abandoned on Postgres is cancelled on the server with an
//     out-of-band cancel request, not a pool connection);
//   - a PostgresListener: one of its own, outside the pool;
//   - a Group: one per worker (WithGroupWorkers) and one for its probe,
//     however many tenants it runs (Group gives the process's budget).
//
// A pool with as many connections as those run at once never makes one
// wait. The one way to break the rule is the application's: a handler
// that uses the application's *gorm.DB (or *sql.DB) instead of the batch
// transaction (TxFromContext) takes a second connection while its batch
// holds one, and waits forever on a pool that has none to spare.
//
// # Concurrency
//
// Subscribers, checkpoint stores, parking lots, notifiers and listeners are
// safe for concurrent use. Run owns its goroutine: handlers run on it, one
// event at a time, and it returns once its context is cancelled and the
// batch in flight (if any) has drained (see Shutdown). One Subscriber runs
// one Run at a time (a second concurrent Run returns ErrRunning) and can
// be run again after Run returned. With WithConcurrency(k), Run also owns
// k worker goroutines, and the handler runs on up to k of them at once
// (one event at a time per partition); they end before Run returns.
//
// # Other backends
//
// CheckpointStore (with its Batch), ParkingLot and domain.EventStore are
// interfaces, and the run loop, partitions, retries and status reach
// their implementations through them and through optional capabilities
// only, the way database/sql reaches a driver: a backend outside this
// package can get every guarantee above. Each capability's documentation
// says what the loop does with it and without it:
//
//   - a CheckpointStore's: CheckpointResetter (rebuilds in place),
//     AttemptCounter (attempt counts across replicas and restarts),
//     PartitionCheckpointStore (partitions in one statement and one
//     transaction), Pauser (Pause, SwitchOver), Repartitioner
//     (Repartition), DeliveryMarker and its batches' MarkedBatch
//     (DeliveryFrom's re-deliveries and catch-ups), FailureClassifier
//     (commit failures blamed on events), FeedSharer, FeedAcquirer and
//     their batches' BatchFeedReader (reading the feed on the batch's own
//     connection);
//   - a Batch's: TxEndChecker (a statement that ended the transaction),
//     ResetAborter (a batch a reset ended);
//   - a ParkingLot's: ManagedParkingLot, ParkingLotPurger,
//     DeliveredClearer, PartitionDeliveredClearer, ParkedCounter,
//     OrderedParkingLot (WithOrderedParking's queues);
//   - a domain.EventStore's: PartitionFeed and FeedIndex (partitions read
//     in the store's own query language).
//
// Package subscriptionstest holds a behavioural suite per interface and
// per capability, which this module's memory, SQLite (both drivers) and
// Postgres implementations pass, for a new backend to run in its own
// tests.
package subscriptions
