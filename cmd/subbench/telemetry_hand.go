package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// handTelemetry is the instrumentation an application would write by hand
// around the baseline's plain loop, with the SDK scenario 8 installs: a
// span per batch (a new root) and per upsert (its child, ended as the
// upsert returns, the way `defer span.End()` does), the same attributes as
// the library's spans, and the same three metric records (events handled,
// batch and handler durations). Scenario 8's "baseline+spans" contestant
// uses it to show what the SDK costs a loop with no library in it. Only
// the catch-up's goroutine uses it.
type handTelemetry struct {
	tracer          trace.Tracer
	events          metric.Int64Counter
	batchDuration   metric.Float64Histogram
	handlerDuration metric.Float64Histogram
	subscriber      attribute.KeyValue
	record          metric.RecordOption
	handled         metric.AddOption
}

// newHandTelemetry creates the instruments from the providers, named as
// the library names its own.
func newHandTelemetry(mp metric.MeterProvider, tp trace.TracerProvider, name string) (*handTelemetry, error) {
	m := mp.Meter("subbench/baseline")
	h := &handTelemetry{tracer: tp.Tracer("subbench/baseline"), subscriber: subscriptions.AttrSubscriber.String(name)}
	set := attribute.NewSet(h.subscriber)
	h.record = metric.WithAttributeSet(set)
	h.handled = metric.WithAttributeSet(attribute.NewSet(h.subscriber, subscriptions.AttrOutcome.String(subscriptions.OutcomeHandled)))
	var err error
	if h.events, err = m.Int64Counter(subscriptions.MetricEvents); err != nil {
		return nil, fmt.Errorf("metric %s: %w", subscriptions.MetricEvents, err)
	}
	if h.batchDuration, err = m.Float64Histogram(subscriptions.MetricBatchDuration, metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("metric %s: %w", subscriptions.MetricBatchDuration, err)
	}
	if h.handlerDuration, err = m.Float64Histogram(subscriptions.MetricHandlerDuration, metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("metric %s: %w", subscriptions.MetricHandlerDuration, err)
	}
	return h, nil
}

// batch starts a batch's span; the returned function ends it and records
// the batch's duration and, when err is nil, its events.
func (h *handTelemetry) batch(ctx context.Context, events []domain.EventEnvelope[any]) (context.Context, func(error)) {
	start := time.Now()
	ctx, span := h.tracer.Start(ctx, subscriptions.SpanBatch, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(h.subscriber, subscriptions.AttrBatchSize.Int(len(events)), subscriptions.AttrEventPosition.Int64(events[0].Position)))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			h.events.Add(ctx, int64(len(events)), h.handled)
		}
		h.batchDuration.Record(ctx, time.Since(start).Seconds(), h.record)
		span.End()
	}
}

// handle runs fn for ev under a span of its own and times it.
func (h *handTelemetry) handle(ctx context.Context, ev domain.EventEnvelope[any], fn func() error) error {
	start := time.Now()
	ctx, span := h.tracer.Start(ctx, subscriptions.SpanHandle, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(h.subscriber, subscriptions.AttrEventID.String(ev.ID), subscriptions.AttrEventType.String(ev.EventType),
			subscriptions.AttrEventPosition.Int64(ev.Position), subscriptions.AttrAttempt.Int(1)))
	defer span.End()
	err := fn()
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	h.handlerDuration.Record(ctx, time.Since(start).Seconds(), h.record)
	return err
}
