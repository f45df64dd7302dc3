package watermill

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// ErrNoPublisher is returned by New without a publisher.
var ErrNoPublisher = errors.New("watermill: a message.Publisher is required")

// Outgoing is one event's message on its way to the broker, as a
// BatchPublisher is given it.
type Outgoing struct {
	// Topic is where the message goes (a NATS subject, an AMQP routing
	// key or queue, a Kafka topic), as WithTopic chose it.
	Topic string
	// Key is the ordering key, the event's aggregate ID: messages that
	// share a Key must reach the broker in slice order.
	Key string
	// Message carries the event ID as its UUID and the metadata of
	// package doc's "Metadata".
	Message *message.Message
}

// BatchPublisher is the optional capability of a message.Publisher that
// publishes a whole batch at once (pipelined, with its acknowledgements
// gathered) instead of one Publish call per run of messages to one topic.
// The Forwarder uses it when the publisher it is given implements it, as
// natsjs.Publisher does.
//
// PublishBatch returns nil only once the broker has acknowledged every
// message (stored it durably, as far as the broker goes), so that the
// subscriber's checkpoint commits after the broker has the messages. It
// must keep the slice order of messages that share a Key on the broker
// even when it fails part-way and the batch is published again (natsjs
// has at most one message per key in flight), and it must honour ctx. It
// is called from the subscriber's goroutine, or from several partition
// workers at once with WithPartitions: it must be safe for concurrent use.
// The slice is the caller's: it must not be kept past the call.
type BatchPublisher interface {
	PublishBatch(ctx context.Context, msgs []Outgoing) error
}

// Forwarder turns a watermill message.Publisher into a subscriber's
// handler: each event becomes one message (package doc, "Messages"). It
// holds no state between calls and is safe for concurrent use: one
// Forwarder may serve several subscribers and partitions.
type Forwarder struct {
	pub       message.Publisher
	batch     BatchPublisher // pub's capability, if it has it
	topic     func(domain.EventEnvelope[any]) string
	marshaler Marshaler
	tenant    func(domain.EventEnvelope[any]) string
}

// Option configures a Forwarder.
type Option func(*Forwarder)

// WithTopic chooses each event's topic (default TopicByType("")): see
// TopicConst, TopicByType, TopicByCategory and natsjs.SubjectPerAggregate.
// topic must be a pure function of the event, so that a re-delivery goes
// where the first delivery went.
func WithTopic(topic func(ev domain.EventEnvelope[any]) string) Option {
	return func(f *Forwarder) { f.topic = topic }
}

// WithMarshaler replaces JSONMarshaler, which writes the payload as JSON.
// The Forwarder sets the message's UUID and the standard metadata after
// the marshaler has run (a key the marshaler set is kept).
func WithMarshaler(m Marshaler) Option {
	return func(f *Forwarder) { f.marshaler = m }
}

// WithTenant names the tenant of each event, sent as MetadataTenant
// (omitted when empty). The default reads the event's metadata under
// "tenant".
func WithTenant(tenant func(ev domain.EventEnvelope[any]) string) Option {
	return func(f *Forwarder) { f.tenant = tenant }
}

// New returns a Forwarder publishing through pub; pub stays the caller's
// to close, after the subscribers using it have stopped.
func New(pub message.Publisher, opts ...Option) (*Forwarder, error) {
	if pub == nil {
		return nil, ErrNoPublisher
	}
	f := &Forwarder{pub: pub, topic: TopicByType(""), marshaler: JSONMarshaler{}, tenant: metadataTenant}
	for _, o := range opts {
		o(f)
	}
	if f.topic == nil || f.marshaler == nil || f.tenant == nil {
		return nil, errors.New("watermill: WithTopic, WithMarshaler and WithTenant must not be given nil")
	}
	f.batch, _ = pub.(BatchPublisher)
	return f, nil
}

// Handler returns the per-event handler: one message per call, returned
// from once the publisher has it. Give it to subscriptions.NewSubscriber.
func (f *Forwarder) Handler() subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		return f.Publish(ctx, []domain.EventEnvelope[any]{ev})
	}
}

// BatchHandler returns the batch handler (subscriptions.WithBatchHandler):
// the whole batch is published, with a BatchPublisher in one pipelined
// call, and the call returns once the broker has acknowledged it all, so
// the checkpoint commits after the broker has every message: the form to
// use for throughput.
func (f *Forwarder) BatchHandler() subscriptions.BatchHandler {
	return f.Publish
}

// Publish sends events, in feed order, as messages: with a BatchPublisher
// in one call, otherwise with one Publish call per run of consecutive
// events to the same topic. It returns the first failure, wrapped with the
// positions it concerns; the events before it may have been published
// (they are published again, with the same UUIDs, when the subscriber
// retries).
func (f *Forwarder) Publish(ctx context.Context, events []domain.EventEnvelope[any]) error {
	if len(events) == 0 {
		return nil
	}
	out := make([]Outgoing, len(events))
	for i, ev := range events {
		o, err := f.outgoing(ctx, ev)
		if err != nil {
			return err
		}
		out[i] = o
	}
	if f.batch != nil {
		if err := f.batch.PublishBatch(ctx, out); err != nil {
			return fmt.Errorf("watermill: publish events at positions %d..%d: %w", events[0].Position, events[len(events)-1].Position, err)
		}
		return nil
	}
	for start := 0; start < len(out); {
		end := start + 1
		for end < len(out) && out[end].Topic == out[start].Topic {
			end++
		}
		msgs := make([]*message.Message, 0, end-start)
		for _, o := range out[start:end] {
			msgs = append(msgs, o.Message)
		}
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		if err := f.pub.Publish(out[start].Topic, msgs...); err != nil {
			return fmt.Errorf("watermill: publish events at positions %d..%d to %q: %w", events[start].Position, events[end-1].Position, out[start].Topic, err)
		}
		start = end
	}
	return nil
}

// outgoing builds one event's message.
func (f *Forwarder) outgoing(ctx context.Context, ev domain.EventEnvelope[any]) (Outgoing, error) {
	topic := f.topic(ev)
	if topic == "" {
		return Outgoing{}, fmt.Errorf("watermill: event %s (%s, position %d): the topic function returned an empty topic", ev.ID, ev.EventType, ev.Position)
	}
	msg, err := f.marshaler.Marshal(ev)
	if err != nil {
		return Outgoing{}, fmt.Errorf("watermill: marshal event %s (%s, position %d): %w", ev.ID, ev.EventType, ev.Position, err)
	}
	if msg == nil {
		return Outgoing{}, fmt.Errorf("watermill: marshal event %s (%s, position %d): the marshaler returned no message", ev.ID, ev.EventType, ev.Position)
	}
	msg.UUID = ev.ID
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	for k, v := range Metadata(ctx, ev, f.tenant(ev)) {
		if msg.Metadata.Get(k) == "" {
			msg.Metadata.Set(k, v)
		}
	}
	msg.SetContext(ctx)
	return Outgoing{Topic: topic, Key: ev.AggregateID, Message: msg}, nil
}
