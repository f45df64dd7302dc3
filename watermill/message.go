package watermill

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// Metadata keys of every forwarded message (package doc, "Messages").
const (
	MetadataEventType     = "event_type"
	MetadataAggregateID   = "aggregate_id"
	MetadataSequenceNo    = "sequence_no"
	MetadataPosition      = "position"
	MetadataCreated       = "created" // RFC 3339, nanoseconds, UTC
	MetadataTransactionID = "transaction_id"
	MetadataTenant        = "tenant"
	// MetadataPartitionKey is the aggregate ID again, under the name a
	// Kafka-like publisher's partitioning marshaler is pointed at.
	MetadataPartitionKey = "partition_key"
	// MetadataTraceParent and MetadataTraceState carry the W3C Trace
	// Context, under the keys subscriptions.TracingEventStore uses.
	MetadataTraceParent = subscriptions.MetadataTraceParent
	MetadataTraceState  = subscriptions.MetadataTraceState
)

// Marshaler turns an event into a message. The Forwarder then sets the
// message's UUID to the event ID and adds the standard metadata under the
// keys the marshaler left unset. Implementations must be safe for
// concurrent use and deterministic (a re-delivery must produce the same
// message, for a consumer comparing them).
type Marshaler interface {
	Marshal(ev domain.EventEnvelope[any]) (*message.Message, error)
}

// JSONMarshaler writes the event's payload as JSON (a payload read back
// from a database as raw JSON is sent as it is) and no metadata of its
// own.
type JSONMarshaler struct{}

// Marshal implements Marshaler.
func (JSONMarshaler) Marshal(ev domain.EventEnvelope[any]) (*message.Message, error) {
	var payload []byte
	switch p := ev.Payload.(type) {
	case json.RawMessage:
		payload = p
	default:
		var err error
		if payload, err = json.Marshal(p); err != nil {
			return nil, err
		}
	}
	return message.NewMessage(ev.ID, payload), nil
}

// traceContext is the W3C Trace Context propagator, the one package
// subscriptions writes event metadata with.
var traceContext propagation.TraceContext

// Metadata returns the standard metadata of ev's message: type, aggregate
// ID (also as MetadataPartitionKey), sequence number, position, creation
// time, transaction ID and tenant when not empty, and the trace context.
// The trace context is the one the event was appended under
// (subscriptions.TracingEventStore), so a consumer's span joins the
// request that caused the event; for an event without a valid one, the
// span in ctx (the subscriber's handler span), if any.
func Metadata(ctx context.Context, ev domain.EventEnvelope[any], tenant string) message.Metadata {
	md := message.Metadata{
		MetadataEventType:    ev.EventType,
		MetadataAggregateID:  ev.AggregateID,
		MetadataPartitionKey: ev.AggregateID,
		MetadataSequenceNo:   strconv.Itoa(ev.SequenceNo),
		MetadataPosition:     strconv.FormatInt(ev.Position, 10),
	}
	if !ev.Created.IsZero() {
		md[MetadataCreated] = ev.Created.UTC().Format(time.RFC3339Nano)
	}
	if ev.TransactionID != "" {
		md[MetadataTransactionID] = ev.TransactionID
	}
	if tenant != "" {
		md[MetadataTenant] = tenant
	}
	if tp, _ := ev.Metadata[MetadataTraceParent].(string); tp != "" {
		if appended := traceContext.Extract(context.Background(), stringCarrier(ev.Metadata)); trace.SpanContextFromContext(appended).IsValid() {
			ctx = appended
		}
	}
	if trace.SpanContextFromContext(ctx).IsValid() {
		traceContext.Inject(ctx, propagation.MapCarrier(md))
	}
	return md
}

// stringCarrier reads the string values of event metadata.
type stringCarrier map[string]any

func (c stringCarrier) Get(key string) string { v, _ := c[key].(string); return v }
func (c stringCarrier) Set(string, string)    {}
func (c stringCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// metadataTenant is WithTenant's default: the event metadata's "tenant".
func metadataTenant(ev domain.EventEnvelope[any]) string {
	t, _ := ev.Metadata["tenant"].(string)
	return t
}

// TopicConst sends every event to topic.
func TopicConst(topic string) func(domain.EventEnvelope[any]) string {
	return func(domain.EventEnvelope[any]) string { return topic }
}

// TopicByType sends each event to prefix + its event type.
func TopicByType(prefix string) func(domain.EventEnvelope[any]) string {
	return func(ev domain.EventEnvelope[any]) string { return prefix + ev.EventType }
}

// TopicByCategory sends each event to prefix + its aggregate's category:
// the aggregate ID up to its first '-' ("order-17" is in category
// "order"), or the whole ID when it has none.
func TopicByCategory(prefix string) func(domain.EventEnvelope[any]) string {
	return func(ev domain.EventEnvelope[any]) string { return prefix + Category(ev.AggregateID) }
}

// Category is an aggregate ID's category: the ID up to its first '-'.
func Category(aggregateID string) string {
	if i := strings.IndexByte(aggregateID, '-'); i > 0 {
		return aggregateID[:i]
	}
	return aggregateID
}
