package domain_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/eventfeed/subscriptions/domain"
)

type benchPayload struct {
	ID     string  `json:"id"`
	Name   string  `json:"name"`
	Amount float64 `json:"amount"`
	Count  int     `json:"count"`
}

func BenchmarkDispatchTypedDecode(b *testing.B) {
	d := domain.NewEventDispatcher()
	var sink benchPayload
	if err := domain.Subscribe(d, "bench.event", func(_ context.Context, env domain.EventEnvelope[benchPayload]) error {
		sink = env.Payload
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name    string
		payload any
	}{
		{"map", map[string]any{"id": "p-1", "name": "widget", "amount": 12.5, "count": 3.0}},
		{"struct", benchPayload{ID: "p-1", Name: "widget", Amount: 12.5, Count: 3}},
		{"pointer", &benchPayload{ID: "p-1", Name: "widget", Amount: 12.5, Count: 3}},
		{"raw-json", []byte(`{"id":"p-1","name":"widget","amount":12.5,"count":3}`)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			env := domain.EventEnvelope[any]{ID: "evt-1", AggregateID: "agg", EventType: "bench.event", Payload: c.payload}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Dispatch(ctx, env); err != nil {
					b.Fatal(err)
				}
			}
			if sink.ID != "p-1" {
				b.Fatalf("decoded %+v", sink)
			}
		})
	}
}

func BenchmarkDispatchRouting(b *testing.B) {
	d := domain.NewEventDispatcher()
	calls := 0
	h := domain.EventHandler[any](func(context.Context, domain.EventEnvelope[any]) error {
		calls++
		return nil
	})
	aggregates := []string{"user", "order", "invoice", "payment", "shipment"}
	for _, a := range aggregates {
		for _, p := range []string{a + ".created", a + ".updated", a + ".*"} {
			if err := domain.Subscribe(d, p, h); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, p := range []string{"*.created", "*.deleted", "*.*", "*.*.*", "audit.*.logged"} {
		if err := domain.Subscribe(d, p, h); err != nil {
			b.Fatal(err)
		}
	}
	// 20 patterns.
	var envs []domain.EventEnvelope[any]
	for i, a := range aggregates {
		for _, v := range []string{"created", "updated", "deleted", "archived"} {
			envs = append(envs, domain.EventEnvelope[any]{ID: fmt.Sprint("evt-", i), EventType: a + "." + v})
		}
	}
	envs = append(envs, domain.EventEnvelope[any]{ID: "evt-audit", EventType: "audit.user.logged"})
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := d.Dispatch(ctx, envs[i%len(envs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if calls == 0 {
		b.Fatal("no handler ran")
	}
}
