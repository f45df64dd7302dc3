// Package brokertest is the nested module's test harness for the real
// brokers: NATS JetStream and RabbitMQ on this machine, streams and queues
// named per test run (so concurrent runs never meet) and removed at
// cleanup, a TCP proxy that cuts a connection, and the crash child.
//
// The brokers are reached through SUBSCRIPTIONS_NATS_URL (default
// nats://127.0.0.1:4222) and SUBSCRIPTIONS_AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/). A broker that does not answer skips
// the test, unless SUBSCRIPTIONS_REQUIRE_BROKERS=1 or
// SUBSCRIPTIONS_REQUIRE_POSTGRES=1 (as .ci/run sets), when it fails it.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Environment variables.
const (
	NATSEnv    = "SUBSCRIPTIONS_NATS_URL"
	AMQPEnv    = "SUBSCRIPTIONS_AMQP_URL"
	RequireEnv = "SUBSCRIPTIONS_REQUIRE_BROKERS"
)

// NATSURL is the NATS server's URL.
func NATSURL() string { return envOr(NATSEnv, "nats://127.0.0.1:4222") }

// AMQPURL is the RabbitMQ server's URL.
func AMQPURL() string { return envOr(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/") }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// required reports whether a missing broker fails the test.
func required() bool {
	return os.Getenv(RequireEnv) == "1" || os.Getenv("SUBSCRIPTIONS_REQUIRE_POSTGRES") == "1"
}

// require skips or fails the test when nothing answers at addr.
func require(t testing.TB, what, rawURL string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("brokertest: %s URL %q: %v", what, rawURL, err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 3*time.Second)
	if err == nil {
		_ = c.Close()
		return
	}
	if required() {
		t.Fatalf("%s not reachable at %s: %v; %s=1 (or SUBSCRIPTIONS_REQUIRE_POSTGRES=1) requires it", what, u.Host, err, RequireEnv)
	}
	t.Skipf("%s not reachable at %s (set %s=1 to fail instead): %v", what, u.Host, RequireEnv, err)
}

// Suffix returns a name suffix unique to this call.
func Suffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Connect opens a NATS connection to url that reconnects forever, closed at
// cleanup.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("brokertest: connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Stream is one test's JetStream stream, deleted at cleanup.
type Stream struct {
	Name    string // the stream's name
	Subject string // prefix: the stream takes Subject + ".>"
	NC      *nats.Conn
	JS      jetstream.JetStream
}

// NewStream creates a file-backed stream of its own for the test, with the
// given Duplicates window.
func NewStream(t testing.TB, dedup time.Duration) *Stream {
	t.Helper()
	require(t, "NATS", NATSURL())
	nc := Connect(t, NATSURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	sfx := Suffix()
	s := &Stream{Name: "SUBTEST_" + sfx, Subject: "subtest." + sfx, NC: nc, JS: js}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: s.Name, Subjects: []string{s.Subject + ".>"}, Storage: jetstream.FileStorage, Duplicates: dedup,
	}); err != nil {
		t.Fatalf("brokertest: create stream %s: %v", s.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, s.Name); err != nil {
			t.Errorf("brokertest: delete stream %s: %v", s.Name, err)
		}
	})
	return s
}

// Received is one message as a consumer saw it.
type Received struct {
	UUID        string
	AggregateID string
	SequenceNo  string
	Header      nats.Header
	Data        []byte
	StreamSeq   uint64
}

// ReadAll reads the whole stream in stream order with an ordered consumer,
// waiting (bounded) until it holds at least want messages, and returns
// them.
func (s *Stream) ReadAll(t testing.TB, want int) []Received {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := s.JS.Stream(ctx, s.Name)
		if err != nil {
			t.Fatalf("brokertest: stream %s: %v", s.Name, err)
		}
		if int(info.CachedInfo().State.Msgs) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := s.JS.Stream(ctx, s.Name)
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	total := int(st.CachedInfo().State.Msgs)
	out := make([]Received, 0, total)
	if total == 0 {
		return out
	}
	cons, err := s.JS.OrderedConsumer(ctx, s.Name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("brokertest: ordered consumer on %s: %v", s.Name, err)
	}
	for len(out) < total {
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			t.Fatalf("brokertest: fetch from %s: %v", s.Name, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, _ := m.Metadata()
			r := Received{UUID: m.Headers().Get("Nats-Msg-Id"), AggregateID: m.Headers().Get("aggregate_id"),
				SequenceNo: m.Headers().Get("sequence_no"), Header: m.Headers(), Data: m.Data()}
			if md != nil {
				r.StreamSeq = md.Sequence.Stream
			}
			out = append(out, r)
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("brokertest: fetch from %s: %v", s.Name, err)
		}
		if n == 0 {
			if ctx.Err() != nil {
				t.Fatalf("brokertest: read %d of %d messages from %s", len(out), total, s.Name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return out
}

// Queue is one test's durable RabbitMQ queue, deleted at cleanup.
type Queue struct {
	Name string
}

// NewQueue declares a durable queue of the test's own (a publisher on the
// default exchange does not declare it, and RabbitMQ drops what it cannot
// route) and deletes it at cleanup.
func NewQueue(t testing.TB) *Queue {
	t.Helper()
	require(t, "RabbitMQ", AMQPURL())
	q := &Queue{Name: "subtest-" + Suffix()}
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		t.Fatalf("brokertest: connect to RabbitMQ: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	if _, err := ch.QueueDeclare(q.Name, true, false, false, false, nil); err != nil {
		t.Fatalf("brokertest: declare queue %s: %v", q.Name, err)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(AMQPURL())
		if err != nil {
			t.Errorf("brokertest: connect to delete queue %s: %v", q.Name, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("brokertest: %v", err)
			return
		}
		if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
			t.Errorf("brokertest: delete queue %s: %v", q.Name, err)
		}
	})
	return q
}

// AMQPMessage is one message as a RabbitMQ consumer saw it.
type AMQPMessage struct {
	UUID        string
	AggregateID string
	SequenceNo  string
	Body        []byte
}

// Drain reads every message in the queue (acknowledging it), waiting
// (bounded) until at least want have come and then until the queue has
// been quiet for a moment.
func (q *Queue) Drain(t testing.TB, want int) []AMQPMessage {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	if err := ch.Qos(2000, 0, false); err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	deliveries, err := ch.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		t.Fatalf("brokertest: consume %s: %v", q.Name, err)
	}
	var out []AMQPMessage
	deadline := time.After(2 * time.Minute)
	for {
		quiet := 300 * time.Millisecond
		if len(out) < want {
			quiet = 30 * time.Second
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("brokertest: the consumer of %s closed after %d messages", q.Name, len(out))
			}
			s := func(k string) string { v, _ := d.Headers[k].(string); return v }
			out = append(out, AMQPMessage{UUID: s("_watermill_message_uuid"), AggregateID: s("aggregate_id"), SequenceNo: s("sequence_no"), Body: d.Body})
			if err := d.Ack(false); err != nil {
				t.Fatalf("brokertest: ack: %v", err)
			}
		case <-time.After(quiet):
			return out
		case <-deadline:
			t.Fatalf("brokertest: draining %s: %d of at least %d messages within 2 minutes", q.Name, len(out), want)
		}
	}
}
