// Package watermill forwards a subscriber's feed to a message broker
// through any watermill message.Publisher (Kafka, NATS JetStream, AMQP,
// Redis Streams, Google Pub/Sub, SQL): the transactional outbox, with the
// event store as the outbox. It is a module of its own, so that watermill
// and the broker clients stay out of package subscriptions' dependencies.
//
//	fwd, _ := watermill.New(publisher, watermill.WithTopic(watermill.TopicByCategory("events.")))
//	sub, _ := subscriptions.NewSubscriber("orders-to-broker", events, checkpoints, nil,
//		subscriptions.WithBatchHandler(fwd.BatchHandler()))
//
// docs/outbound.md in the repository is the how-to.
//
// # Messages
//
// Each event becomes one message: the event ID is the message UUID (and,
// on JetStream, the Nats-Msg-Id dedup key), the payload is the
// Marshaler's (JSON by default, WithMarshaler to replace it), and the
// metadata carries the event type, aggregate ID (also as
// MetadataPartitionKey), sequence number, position, creation time,
// transaction ID and tenant (WithTenant) when set, and the W3C trace
// context (traceparent, tracestate) the event was appended under
// (subscriptions.TracingEventStore), or else the handler's span. The topic
// is WithTopic's function of the event (by type, by aggregate category, a
// NATS subject per aggregate).
//
// # Ordering
//
// The Forwarder hands the broker each aggregate's events in feed order;
// what the broker keeps of that order is the broker's:
//
//   - JetStream (natsjs.Publisher): a stream stores each aggregate's
//     events in feed order, whatever fails: at most one message per
//     aggregate is in flight, so a lost or retried message is never
//     overtaken by its aggregate's next one. Events of different
//     aggregates are pipelined and may be stored out of feed order. A
//     subject per aggregate (natsjs.SubjectPerAggregate) lets a consumer
//     filter one aggregate or one category.
//   - AMQP (watermill-amqp with Publish.ConfirmDelivery): RabbitMQ keeps
//     the order per queue for one publishing channel; the Forwarder
//     publishes a batch in feed order, each message confirmed before the
//     next. Several consumers on one queue, or redeliveries after a
//     consumer's nack, reorder on the consumer side.
//   - Kafka-like publishers keep order per partition: point the
//     publisher's partitioning marshaler at MetadataPartitionKey, so that
//     an aggregate's events share a partition.
//
// Any publisher without the BatchPublisher capability gets one Publish
// call per run of consecutive events to the same topic, in feed order; it
// keeps the order only if its Publish returns after the broker has each
// message, in order (a publisher that buffers and returns early can
// lose or reorder on a failure). A parked event (WithParkingLot) is
// skipped and its aggregate's later events go on, as for any handler;
// ReplayParked then publishes it after them.
//
// # Effectively once
//
// The batch handler returns only after the broker acknowledged every
// message, and the subscriber commits its checkpoint after that. A crash
// or failure between the broker's acknowledgement and the commit delivers
// the events again, with the same UUIDs:
//
//   - JetStream drops them as duplicates (by Nats-Msg-Id, which natsjs
//     sets, and watermill-nats' publisher with JetStreamConfig.TrackMsgId)
//     as long as they come back within the stream's Duplicates window
//     (default two minutes): consumers see every event once. The window must exceed
//     the longest time from a crash to the end of the re-publication:
//     restart time, plus the subscriber's retries and backoff
//     (WithRetryBackoff), plus a partition takeover. An outage longer than
//     the window can show a duplicate.
//   - Brokers without deduplication (AMQP, most Kafka setups) are
//     at-least-once: consumers drop repeats by message UUID (watermill's
//     deduplicator middleware, or a processed-IDs table).
//
// # Failures
//
// A failed publish is a handler failure: the batch is retried one event
// at a time, and an event the broker refuses (no stream for its subject,
// too large) is retried and parked per WithMaxRetries and WithParkingLot.
// A broker that is down or unreachable stalls this subscriber only (other
// subscribers of the process go on) until it is back: natsjs fails at once
// while disconnected (ErrNotConnected), and the subscriber retries every
// poll interval. With a parking lot, an outage longer than the retry
// budget would park events: a forwarder is best run without one, or with
// a WithMaxRetries and WithRetryBackoff budget longer than the outages to
// ride out.
//
// # Throughput
//
// Give the Forwarder a BatchPublisher (natsjs.Publisher for JetStream):
// a batch is then published asynchronously, pipelined on one connection,
// and the acknowledgements gathered before the handler returns, instead
// of one round trip per event. The batch size (WithBatchSize) is what is
// pipelined; several partitions (WithPartitions, WithConcurrency) publish
// at once. cmd/fwdbench measures it against watermill-sql's forwarder and
// a hand-written loop.
package watermill
