package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/watermill"
	"github.com/eventfeed/subscriptions/watermill/internal/brokertest"
	"github.com/eventfeed/subscriptions/watermill/natsjs"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// TestPublisherAsWatermillPublisher: used as a plain message.Publisher
// (a watermill router's, say), it publishes in order with the UUID as
// Nats-Msg-Id and WatermillUUIDHeader, so publishing the same messages
// again adds nothing to the stream.
func TestPublisherAsWatermillPublisher(t *testing.T) {
	s := brokertest.NewStream(t, time.Minute)
	pub, err := natsjs.NewPublisher(s.NC)
	require.NoError(t, err)
	msgs := []*message.Message{message.NewMessage("a-1", []byte("1")), message.NewMessage("a-2", []byte("2")), message.NewMessage("a-3", []byte("3"))}
	msgs[0].Metadata.Set("aggregate_id", "a")
	for range 2 {
		require.NoError(t, pub.Publish(s.Subject+".x", msgs...))
	}
	got := s.ReadAll(t, 3)
	require.Len(t, got, 3)
	for i, r := range got {
		require.Equal(t, msgs[i].UUID, r.UUID)
		require.Equal(t, msgs[i].UUID, r.Header.Get(natsjs.WatermillUUIDHeader))
		require.Equal(t, string(msgs[i].Payload), string(r.Data))
	}
	require.Equal(t, "a", got[0].AggregateID)
	require.NoError(t, pub.Close())
	require.True(t, pub.IsConnected(), "Close closed the caller's connection")
}

// TestPublisherNotConnected: a batch fails at once, with ErrNotConnected,
// on a connection that is down.
func TestPublisherNotConnected(t *testing.T) {
	s := brokertest.NewStream(t, time.Minute)
	nc, err := nats.Connect(brokertest.NATSURL())
	require.NoError(t, err)
	pub, err := natsjs.NewPublisher(nc)
	require.NoError(t, err)
	nc.Close()
	err = pub.PublishBatch(context.Background(), []watermill.Outgoing{{Topic: s.Subject + ".x", Key: "a", Message: message.NewMessage("a-1", nil)}})
	require.ErrorIs(t, err, natsjs.ErrNotConnected)
	require.False(t, pub.IsConnected())
	_, err = natsjs.NewPublisher(nil)
	require.Error(t, err)
	_, err = natsjs.NewPublisher(s.NC, natsjs.WithAckWait(0))
	require.Error(t, err)
}

// TestSubjectPerAggregate: the subject is prefix.category.aggregate, each
// token cleaned of what a subject token cannot hold.
func TestSubjectPerAggregate(t *testing.T) {
	subject := natsjs.SubjectPerAggregate("orders")
	require.Equal(t, "orders.order.order-7", subject(domain.EventEnvelope[any]{AggregateID: "order-7"}))
	require.Equal(t, "orders.a_b_c_d.a_b_c_d", subject(domain.EventEnvelope[any]{AggregateID: "a.b*c>d"}))
	require.Equal(t, "orders._._", subject(domain.EventEnvelope[any]{}))
}
