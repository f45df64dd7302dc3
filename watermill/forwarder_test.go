package watermill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	wm "github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/watermill"
	"github.com/eventfeed/subscriptions/watermill/internal/brokertest"
	"github.com/eventfeed/subscriptions/watermill/natsjs"
)

// runSubscriber runs sub until the test ends.
func runSubscriber(t *testing.T, sub *subscriptions.Subscriber) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// waitCaughtUp waits (bounded) until sub has handled the feed's head.
func waitCaughtUp(t *testing.T, sub *subscriptions.Subscriber) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := sub.WaitCaughtUp(ctx)
	require.NoError(t, err)
}

// appendOrders appends n events to each of aggs aggregates named
// order-<i>, each payload naming its aggregate and number.
func appendOrders(t *testing.T, store domain.EventStore, aggs, n int, md map[string]any) []domain.EventEnvelope[any] {
	t.Helper()
	var all []domain.EventEnvelope[any]
	for k := 1; k <= n; k++ {
		for a := range aggs {
			agg := fmt.Sprintf("order-%d", a)
			ev := domain.NewEventEnvelope[any](map[string]any{"agg": agg, "n": k}, agg, "order.placed", 0)
			for key, v := range md {
				ev.Metadata[key] = v
			}
			require.NoError(t, store.Append(context.Background(), agg, -1, ev))
			all = append(all, ev)
		}
	}
	return all
}

// TestForwardJetStream: every event is one message in the stream, on its
// aggregate's subject, with the event ID as Nats-Msg-Id and watermill
// UUID, the documented metadata and the payload as JSON; a re-delivery of
// the whole feed (a reset) adds nothing, JetStream dropping it as
// duplicates; per-event and batch handler alike.
func TestForwardJetStream(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "handler", true: "batch-handler"}[batch], func(t *testing.T) {
			s := brokertest.NewStream(t, 2*time.Minute)
			pub, err := natsjs.NewPublisher(s.NC)
			require.NoError(t, err)
			fwd, err := watermill.New(pub, watermill.WithTopic(natsjs.SubjectPerAggregate(s.Subject)))
			require.NoError(t, err)

			store := infrastructure.NewMemoryStore()
			tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			events := appendOrders(t, store, 7, 6, map[string]any{"tenant": "acme", "traceparent": tp})
			var handler subscriptions.Handler
			opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(10 * time.Millisecond), subscriptions.WithBatchSize(16)}
			if batch {
				opts = append(opts, subscriptions.WithBatchHandler(fwd.BatchHandler()))
			} else {
				handler = fwd.Handler()
			}
			sub, err := subscriptions.NewSubscriber("fwd", store, subscriptions.NewMemoryCheckpointStore(), handler, opts...)
			require.NoError(t, err)
			runSubscriber(t, sub)
			waitCaughtUp(t, sub)

			got := s.ReadAll(t, len(events))
			require.Len(t, got, len(events))
			byID := map[string]brokertest.Received{}
			for _, r := range got {
				byID[r.UUID] = r
			}
			feed, err := store.ReadAfter(context.Background(), 0, 0)
			require.NoError(t, err)
			for _, ev := range feed {
				r, ok := byID[ev.ID]
				require.True(t, ok, "event %s not in the stream", ev.ID)
				h := r.Header
				require.Equal(t, ev.ID, h.Get(natsjs.WatermillUUIDHeader))
				require.Equal(t, "order.placed", h.Get(watermill.MetadataEventType))
				require.Equal(t, ev.AggregateID, h.Get(watermill.MetadataAggregateID))
				require.Equal(t, ev.AggregateID, h.Get(watermill.MetadataPartitionKey))
				require.Equal(t, strconv.Itoa(ev.SequenceNo), h.Get(watermill.MetadataSequenceNo))
				require.Equal(t, strconv.FormatInt(ev.Position, 10), h.Get(watermill.MetadataPosition))
				require.Equal(t, "acme", h.Get(watermill.MetadataTenant))
				require.Equal(t, tp, h.Get(watermill.MetadataTraceParent))
				created, err := time.Parse(time.RFC3339Nano, h.Get(watermill.MetadataCreated))
				require.NoError(t, err)
				require.True(t, created.Equal(ev.Created))
				var payload map[string]any
				require.NoError(t, json.Unmarshal(r.Data, &payload))
				require.Equal(t, ev.AggregateID, payload["agg"])
			}
			requireAggregateOrder(t, got)

			// A reset re-delivers everything: the stream drops it all.
			require.NoError(t, sub.ResetCheckpoint(context.Background(), 0))
			waitCaughtUp(t, sub)
			require.Len(t, s.ReadAll(t, len(events)), len(events), "a re-delivery reached the stream")
		})
	}
}

// requireAggregateOrder requires that each aggregate's messages come in
// sequence order 1, 2, 3, ... in stream order.
func requireAggregateOrder(t *testing.T, got []brokertest.Received) {
	t.Helper()
	next := map[string]int{}
	for _, r := range got {
		n, err := strconv.Atoi(r.SequenceNo)
		require.NoError(t, err)
		require.Equal(t, next[r.AggregateID]+1, n, "aggregate %s: sequence %d after %d (stream sequence %d)", r.AggregateID, n, next[r.AggregateID], r.StreamSeq)
		next[r.AggregateID] = n
	}
}

// TestForwardTraceFromHandler: an event appended without a trace context
// carries the handler's span's (the subscriber's) instead.
func TestForwardTraceFromHandler(t *testing.T) {
	ev := domain.NewEventEnvelope[any](map[string]any{}, "order-1", "order.placed", 1)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	md := watermill.Metadata(trace.ContextWithSpanContext(context.Background(), sc), ev, "")
	require.Equal(t, "00-01000000000000000000000000000000-0200000000000000-01", md.Get(watermill.MetadataTraceParent))
	require.Empty(t, watermill.Metadata(context.Background(), ev, "").Get(watermill.MetadataTraceParent))
	ev.Metadata[watermill.MetadataTraceParent] = "not a traceparent"
	require.Equal(t, md.Get(watermill.MetadataTraceParent), watermill.Metadata(trace.ContextWithSpanContext(context.Background(), sc), ev, "").Get(watermill.MetadataTraceParent))
	require.Empty(t, md.Get(watermill.MetadataTenant))
}

// TestForwardParksRejected: an event JetStream refuses (its subject is in
// no stream) fails like any handler failure, is retried and parked, and
// the events behind it are forwarded.
func TestForwardParksRejected(t *testing.T) {
	s := brokertest.NewStream(t, 2*time.Minute)
	pub, err := natsjs.NewPublisher(s.NC, natsjs.WithAckWait(2*time.Second))
	require.NoError(t, err)
	nowhere := "nowhere." + brokertest.Suffix()
	fwd, err := watermill.New(pub, watermill.WithTopic(func(ev domain.EventEnvelope[any]) string {
		if ev.EventType == "poison" {
			return nowhere
		}
		return s.Subject + ".orders"
	}))
	require.NoError(t, err)
	store := infrastructure.NewMemoryStore()
	appendOrders(t, store, 3, 1, nil)
	poison := domain.NewEventEnvelope[any](map[string]any{}, "order-x", "poison", 0)
	require.NoError(t, store.Append(context.Background(), poison.AggregateID, -1, poison))
	appendOrders(t, store, 3, 1, nil)

	lot := subscriptions.NewMemoryParkingLot()
	sub, err := subscriptions.NewSubscriber("fwd", store, subscriptions.NewMemoryCheckpointStore(), nil,
		subscriptions.WithBatchHandler(fwd.BatchHandler()), subscriptions.WithPollInterval(10*time.Millisecond),
		subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(1), subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	runSubscriber(t, sub)
	waitCaughtUp(t, sub)
	parked, err := sub.ListParked(context.Background())
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, poison.ID, parked[0].EventID)
	require.Contains(t, parked[0].Error, "natsjs: publish message "+poison.ID)
	require.Len(t, s.ReadAll(t, 6), 6)
}

// TestForwardAMQP: through watermill-amqp (a publisher without the batch
// capability, with publisher confirms) every event reaches the queue once,
// in order, with the event ID as the message UUID and the metadata as
// headers.
func TestForwardAMQP(t *testing.T) {
	q := brokertest.NewQueue(t)
	cfg := amqp.NewDurableQueueConfig(brokertest.AMQPURL())
	cfg.Publish.ConfirmDelivery = true
	pub, err := amqp.NewPublisher(cfg, wm.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	fwd, err := watermill.New(pub, watermill.WithTopic(watermill.TopicConst(q.Name)))
	require.NoError(t, err)

	store := infrastructure.NewMemoryStore()
	events := appendOrders(t, store, 5, 4, map[string]any{"tenant": "acme"})
	sub, err := subscriptions.NewSubscriber("fwd", store, subscriptions.NewMemoryCheckpointStore(), nil,
		subscriptions.WithBatchHandler(fwd.BatchHandler()), subscriptions.WithPollInterval(10*time.Millisecond))
	require.NoError(t, err)
	runSubscriber(t, sub)
	waitCaughtUp(t, sub)

	got := q.Drain(t, len(events))
	require.Len(t, got, len(events))
	for i, m := range got {
		require.Equal(t, events[i].ID, m.UUID, "message %d", i) // one aggregate after the other, as appended
		require.Equal(t, events[i].AggregateID, m.AggregateID)
		require.Equal(t, strconv.Itoa(i/5+1), m.SequenceNo)
	}
}

// TestForwardBrokerOutage: while the broker is unreachable only the
// forwarding subscriber stalls (a projection subscriber on the same store
// keeps up, the forwarder's lag stays), and it resumes by itself when the
// broker is back, with every event in the stream once, in order.
func TestForwardBrokerOutage(t *testing.T) {
	s := brokertest.NewStream(t, 2*time.Minute)
	u, err := url.Parse(brokertest.NATSURL())
	require.NoError(t, err)
	proxy := brokertest.StartProxy(t, u.Host)
	nc := brokertest.Connect(t, "nats://"+proxy.Addr)
	pub, err := natsjs.NewPublisher(nc, natsjs.WithAckWait(time.Second))
	require.NoError(t, err)
	fwd, err := watermill.New(pub, watermill.WithTopic(natsjs.SubjectPerAggregate(s.Subject)))
	require.NoError(t, err)

	store := infrastructure.NewMemoryStore()
	opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(20 * time.Millisecond)}
	forwarder, err := subscriptions.NewSubscriber("fwd", store, subscriptions.NewMemoryCheckpointStore(), nil,
		append(opts, subscriptions.WithBatchHandler(fwd.BatchHandler()))...)
	require.NoError(t, err)
	var projected sync.Map
	projection, err := subscriptions.NewSubscriber("projection", store, subscriptions.NewMemoryCheckpointStore(),
		func(_ context.Context, ev domain.EventEnvelope[any]) error { projected.Store(ev.ID, true); return nil }, opts...)
	require.NoError(t, err)
	runSubscriber(t, forwarder)
	runSubscriber(t, projection)

	events := appendOrders(t, store, 10, 2, nil)
	waitCaughtUp(t, forwarder)
	proxy.Down(t)
	events = append(events, appendOrders(t, store, 10, 3, nil)...)
	waitCaughtUp(t, projection)
	var st subscriptions.Status
	require.Eventually(t, func() bool {
		st, err = forwarder.Status(context.Background())
		require.NoError(t, err)
		return st.Attempts >= 3
	}, time.Minute, 10*time.Millisecond, "the forwarder did not retry against the dead broker")
	require.Contains(t, st.LastError, natsjs.ErrNotConnected.Error())
	require.Equal(t, int64(30), st.Lag, "the forwarder moved on while the broker was down")
	proxy.Up(t)
	waitCaughtUp(t, forwarder)

	got := s.ReadAll(t, len(events))
	require.Len(t, got, len(events))
	requireAggregateOrder(t, got)
	for _, ev := range events {
		_, ok := projected.Load(ev.ID)
		require.True(t, ok)
	}
}

// TestForwardPartitions: with WithPartitions and WithConcurrency several
// partition workers publish through one Forwarder at once; every event
// reaches the stream once, each aggregate in order.
func TestForwardPartitions(t *testing.T) {
	s := brokertest.NewStream(t, 2*time.Minute)
	pub, err := natsjs.NewPublisher(s.NC)
	require.NoError(t, err)
	fwd, err := watermill.New(pub, watermill.WithTopic(natsjs.SubjectPerAggregate(s.Subject)))
	require.NoError(t, err)
	db := dbtest.NewPostgres(t).DB
	store, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	events := appendOrders(t, store, 24, 8, nil)
	sub, err := subscriptions.NewSubscriber("fwd", store, cps, nil, subscriptions.WithBatchHandler(fwd.BatchHandler()),
		subscriptions.WithPartitions(4), subscriptions.WithConcurrency(4), subscriptions.WithBatchSize(10),
		subscriptions.WithPollInterval(10*time.Millisecond))
	require.NoError(t, err)
	runSubscriber(t, sub)
	waitCaughtUp(t, sub)
	got := s.ReadAll(t, len(events))
	require.Len(t, got, len(events))
	requireAggregateOrder(t, got)
}

// upperMarshaler is a replacement marshaler: its own payload and a
// metadata key of its own, one the Forwarder would otherwise set.
type upperMarshaler struct{}

func (upperMarshaler) Marshal(ev domain.EventEnvelope[any]) (*message.Message, error) {
	m := message.NewMessage("ignored", []byte(strings.ToUpper(ev.EventType)))
	m.Metadata.Set("schema", "v2")
	m.Metadata.Set(watermill.MetadataEventType, "custom."+ev.EventType)
	return m, nil
}

// TestForwardMarshaler: through watermill's own in-process Pub/Sub
// (gochannel), a replacement marshaler's payload and metadata are sent,
// the UUID is still the event ID, the standard keys it left unset are
// added, and TopicByCategory routes by the aggregate's category.
func TestForwardMarshaler(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16}, wm.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	msgs, err := ps.Subscribe(context.Background(), "out.order")
	require.NoError(t, err)
	fwd, err := watermill.New(ps, watermill.WithMarshaler(upperMarshaler{}), watermill.WithTopic(watermill.TopicByCategory("out.")),
		watermill.WithTenant(func(domain.EventEnvelope[any]) string { return "t1" }))
	require.NoError(t, err)
	ev := domain.NewEventEnvelope[any](map[string]any{}, "order-9", "order.placed", 1)
	ev.Position = 42
	require.NoError(t, fwd.Publish(context.Background(), []domain.EventEnvelope[any]{ev}))
	select {
	case m := <-msgs:
		m.Ack()
		require.Equal(t, ev.ID, m.UUID)
		require.Equal(t, "ORDER.PLACED", string(m.Payload))
		require.Equal(t, "v2", m.Metadata.Get("schema"))
		require.Equal(t, "custom.order.placed", m.Metadata.Get(watermill.MetadataEventType))
		require.Equal(t, "42", m.Metadata.Get(watermill.MetadataPosition))
		require.Equal(t, "t1", m.Metadata.Get(watermill.MetadataTenant))
	case <-time.After(10 * time.Second):
		t.Fatal("no message on out.order")
	}
	_, err = watermill.New(nil)
	require.ErrorIs(t, err, watermill.ErrNoPublisher)
}
