package subscriptions

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions/domain"
)

// Metadata keys under which TracingEventStore records the appending
// trace's W3C Trace Context (https://www.w3.org/TR/trace-context/).
const (
	MetadataTraceParent = "traceparent"
	MetadataTraceState  = "tracestate"
)

// TracingEventStore decorates an EventStore so that Append records the
// trace context of the span in its ctx (if any) in each event's metadata,
// as W3C traceparent and tracestate strings. A subscriber's handler span
// links to it (see docs/observability.md), so one trace view leads from
// the request that appended an event to every projection that handled it.
//
// It is opt-in because it writes into the stored events: about 55 bytes
// of metadata per event, kept for as long as the event is, and trace IDs
// that whoever reads the events can see. The caller's envelopes are not
// modified (their metadata is copied before the keys are added); an
// existing traceparent in an event's metadata is replaced. Without a valid
// span in ctx, Append is the wrapped store's own, unchanged.
//
// Every method other than Append is the wrapped store's own. A
// TracingEventStore is as safe for concurrent use as the store it wraps,
// and Close closes the wrapped store. Compose it with NotifyingEventStore
// in either order. Subscribers may be given the decorated store or the
// plain one alike: they only read.
type TracingEventStore struct {
	domain.EventStore
}

// NewTracingEventStore wraps store. A nil store returns nil; NewSubscriber
// and the other constructors refuse it.
func NewTracingEventStore(store domain.EventStore) *TracingEventStore {
	if isNil(store) {
		return nil
	}
	return &TracingEventStore{EventStore: store}
}

// Append adds the trace context of ctx's span to each event's metadata
// and delegates to the wrapped store.
func (s *TracingEventStore) Append(ctx context.Context, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	if len(events) == 0 || !trace.SpanContextFromContext(ctx).IsValid() {
		return s.EventStore.Append(ctx, aggregateID, expectedVersion, events...)
	}
	carrier := metadataCarrier{}
	traceContext.Inject(ctx, carrier)
	traced := make([]domain.EventEnvelope[any], len(events))
	for i, ev := range events {
		md := make(map[string]any, len(ev.Metadata)+len(carrier))
		maps.Copy(md, ev.Metadata)
		delete(md, MetadataTraceState)
		maps.Copy(md, carrier)
		ev.Metadata = md
		traced[i] = ev
	}
	return s.EventStore.Append(ctx, aggregateID, expectedVersion, traced...)
}
