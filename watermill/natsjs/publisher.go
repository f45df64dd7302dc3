// Package natsjs is the NATS JetStream publisher of the forwarder in
// package github.com/eventfeed/subscriptions/watermill: a
// message.Publisher that is also a watermill.BatchPublisher, publishing a
// batch asynchronously (pipelined on one connection, acknowledgements
// gathered before it returns) with the message UUID as the Nats-Msg-Id
// dedup key, and at most one message per aggregate in flight, so that the
// stream keeps each aggregate's order whatever fails (see the parent
// package's doc, "Ordering" and "Effectively once").
package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/watermill"
)

// WatermillUUIDHeader is the header watermill-nats subscribers read the
// message UUID from; it is set beside Nats-Msg-Id, so a watermill-nats
// subscriber sees the event ID as the message UUID.
const WatermillUUIDHeader = "_watermill_message_uuid"

// ErrNotConnected fails a batch at once while the connection is down (it
// reconnects by itself), instead of after the ack wait.
var ErrNotConnected = errors.New("natsjs: not connected to the NATS server")

// ErrAckTimeout is the failure of a message whose acknowledgement did not
// come within the ack wait (WithAckWait). The message may be stored: the
// retry publishes it again under the same Nats-Msg-Id.
var ErrAckTimeout = errors.New("natsjs: no acknowledgement from JetStream within the ack wait")

// Publisher publishes to JetStream on a connection it does not own. It is
// safe for concurrent use; Close does not close the connection.
type Publisher struct {
	nc          *nats.Conn
	js          jetstream.JetStream
	ackWait     time.Duration
	maxInFlight int
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithAckWait bounds the wait for one message's acknowledgement (default
// 5s); a message without one fails its batch with ErrAckTimeout.
func WithAckWait(d time.Duration) Option { return func(p *Publisher) { p.ackWait = d } }

// WithMaxInFlight bounds the messages published and not yet acknowledged
// per PublishBatch call (default 1024).
func WithMaxInFlight(n int) Option { return func(p *Publisher) { p.maxInFlight = n } }

// NewPublisher returns a Publisher on nc. The streams are the
// application's: each subject published to must be in one, with a
// Duplicates window longer than a forwarding process's crash-and-restart
// time (parent package doc, "Effectively once"). nc should be made with
// nats.MaxReconnects(-1), so that an outage stalls the forwarder until the
// server is back instead of closing the connection for good.
func NewPublisher(nc *nats.Conn, opts ...Option) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natsjs: a NATS connection is required")
	}
	p := &Publisher{nc: nc, ackWait: 5 * time.Second, maxInFlight: 1024}
	for _, o := range opts {
		o(p)
	}
	if p.ackWait <= 0 || p.maxInFlight <= 0 {
		return nil, errors.New("natsjs: WithAckWait and WithMaxInFlight must be positive")
	}
	// The async timeout removes an unanswered message from the pending
	// set, so lost acknowledgements never stall later publishes.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(p.ackWait), jetstream.WithPublishAsyncMaxPending(4*p.maxInFlight))
	if err != nil {
		return nil, fmt.Errorf("natsjs: JetStream context: %w", err)
	}
	p.js = js
	return p, nil
}

// IsConnected reports whether the connection is up.
func (p *Publisher) IsConnected() bool { return p.nc.IsConnected() }

// Close implements message.Publisher; the connection stays open.
func (p *Publisher) Close() error { return nil }

// Publish implements message.Publisher: the messages, in order, one in
// flight at a time, each with its UUID as Nats-Msg-Id; it returns once
// JetStream has acknowledged them all.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	out := make([]watermill.Outgoing, len(msgs))
	ctx := context.Background()
	for i, m := range msgs {
		out[i] = watermill.Outgoing{Topic: topic, Message: m} // one key: strictly in order
		if i == 0 {
			ctx = m.Context()
		}
	}
	return p.PublishBatch(ctx, out)
}

// PublishBatch implements watermill.BatchPublisher. Messages of different
// keys are pipelined (up to WithMaxInFlight unacknowledged); a key's next
// message is sent only once its previous one is acknowledged, so no
// failure (a lost connection, a timeout, a retry of the batch) can store
// an aggregate's later event before its earlier one. It returns the first
// failure, naming the message; acknowledgements still outstanding then are
// abandoned (the retry resends those messages, deduplicated by ID).
func (p *Publisher) PublishBatch(ctx context.Context, msgs []watermill.Outgoing) error {
	if len(msgs) == 0 {
		return nil
	}
	if st := p.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("%w (%s)", ErrNotConnected, st)
	}
	// next[i] is the index of the following message with msgs[i]'s key.
	next := make([]int, len(msgs))
	last := make(map[string]int, len(msgs))
	ready := make([]int, 0, len(msgs))
	for i, m := range msgs {
		next[i] = -1
		if j, ok := last[m.Key]; ok {
			next[j] = i
		} else {
			ready = append(ready, i)
		}
		last[m.Key] = i
	}
	type pending struct {
		i int
		f jetstream.PubAckFuture
	}
	inflight := make([]pending, 0, min(len(msgs), p.maxInFlight))
	timer := time.NewTimer(p.ackWait)
	defer timer.Stop()
	for len(ready) > 0 || len(inflight) > 0 {
		for len(ready) > 0 && len(inflight) < p.maxInFlight {
			i := ready[0]
			ready = ready[1:]
			f, err := p.js.PublishMsgAsync(natsMsg(msgs[i]), jetstream.WithMsgID(msgs[i].Message.UUID))
			if err != nil {
				return fmt.Errorf("natsjs: publish message %s to %q: %w", msgs[i].Message.UUID, msgs[i].Topic, err)
			}
			inflight = append(inflight, pending{i, f})
		}
		// Acknowledgements come back roughly in publish order: wait for
		// the oldest.
		pf := inflight[0]
		inflight = inflight[1:]
		timer.Reset(p.ackWait)
		select {
		case <-pf.f.Ok():
		case err := <-pf.f.Err():
			return fmt.Errorf("natsjs: publish message %s to %q: %w", msgs[pf.i].Message.UUID, msgs[pf.i].Topic, err)
		case <-timer.C:
			return fmt.Errorf("natsjs: publish message %s to %q: %w", msgs[pf.i].Message.UUID, msgs[pf.i].Topic, ErrAckTimeout)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		if n := next[pf.i]; n >= 0 {
			ready = append(ready, n)
		}
	}
	return nil
}

// natsMsg is a watermill message as a NATS message: the payload, each
// metadata entry as a header, the UUID under WatermillUUIDHeader (the
// Nats-Msg-Id header is PublishBatch's).
func natsMsg(o watermill.Outgoing) *nats.Msg {
	h := make(nats.Header, len(o.Message.Metadata)+2)
	for k, v := range o.Message.Metadata {
		h.Set(k, v)
	}
	h.Set(WatermillUUIDHeader, o.Message.UUID)
	return &nats.Msg{Subject: o.Topic, Data: o.Message.Payload, Header: h}
}

// SubjectPerAggregate sends each event to prefix.<category>.<aggregate ID>
// (watermill.Category), each token made a valid subject token by
// SubjectToken: a consumer can then filter one aggregate, or one
// category with prefix.<category>.*. A stream taking prefix.> holds them
// all, in one order.
func SubjectPerAggregate(prefix string) func(domain.EventEnvelope[any]) string {
	return func(ev domain.EventEnvelope[any]) string {
		return prefix + "." + SubjectToken(watermill.Category(ev.AggregateID)) + "." + SubjectToken(ev.AggregateID)
	}
}

// SubjectToken replaces what a NATS subject token cannot hold ('.', '*',
// '>', white space) with '_'; an empty string becomes "_".
func SubjectToken(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, s)
}
