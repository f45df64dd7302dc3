package natsjs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/eventfeed/subscriptions/watermill"
	"github.com/eventfeed/subscriptions/watermill/internal/brokertest"
	"github.com/eventfeed/subscriptions/watermill/natsjs"
)

// BenchmarkPublishBatch publishes batches of 500 messages: keys drawn from
// 500 aggregates (chains of a few messages per key), all keys distinct (no
// chains), and, as the floor, plain async publishes with every future
// awaited at the end (no per-key order).
func BenchmarkPublishBatch(b *testing.B) {
	const size = 500
	s := brokertest.NewStream(b, time.Minute)
	pub, err := natsjs.NewPublisher(s.NC)
	if err != nil {
		b.Fatal(err)
	}
	batch := func(keys func(i int) string) []watermill.Outgoing {
		out := make([]watermill.Outgoing, size)
		for i := range out {
			k := keys(i)
			m := message.NewMessage(fmt.Sprintf("%d-%d", rand.Int64(), i), []byte(`{"agg":"`+k+`"}`))
			m.Metadata = message.Metadata{"aggregate_id": k, "event_type": "order.placed", "position": "1", "sequence_no": "1"}
			out[i] = watermill.Outgoing{Topic: s.Subject + ".o." + k, Key: k, Message: m}
		}
		return out
	}
	b.Run("500-aggregates", func(b *testing.B) {
		for b.Loop() {
			if err := pub.PublishBatch(context.Background(), batch(func(int) string { return fmt.Sprint(rand.IntN(500)) })); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("distinct-keys", func(b *testing.B) {
		for b.Loop() {
			if err := pub.PublishBatch(context.Background(), batch(func(i int) string { return fmt.Sprint(i) })); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("unordered-floor", func(b *testing.B) {
		js, err := jetstream.New(s.NC)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			msgs := batch(func(int) string { return fmt.Sprint(rand.IntN(500)) })
			fs := make([]jetstream.PubAckFuture, len(msgs))
			for i, o := range msgs {
				h := nats.Header{}
				for k, v := range o.Message.Metadata {
					h.Set(k, v)
				}
				if fs[i], err = js.PublishMsgAsync(&nats.Msg{Subject: o.Topic, Data: o.Message.Payload, Header: h}, jetstream.WithMsgID(o.Message.UUID)); err != nil {
					b.Fatal(err)
				}
			}
			for _, f := range fs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
	})
}
