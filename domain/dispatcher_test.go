package domain_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// The dispatcher's Dispatch has the subscriptions.Handler signature.
var _ func(context.Context, domain.EventEnvelope[any]) error = domain.NewEventDispatcher().Dispatch

func envelope(eventType string, payload any) domain.EventEnvelope[any] {
	return domain.EventEnvelope[any]{
		ID:          "evt-" + eventType,
		AggregateID: "agg-1",
		EventType:   eventType,
		Payload:     payload,
		SequenceNo:  1,
		Metadata:    map[string]any{},
	}
}

// recorder collects the names of the handlers that ran, in order. It is
// deliberately not synchronised: handlers must run one at a time on the
// caller's goroutine, and -race flags any other use.
type recorder struct{ calls []string }

func (r *recorder) handler(name string) func(context.Context, domain.EventEnvelope[any]) error {
	return func(context.Context, domain.EventEnvelope[any]) error {
		r.calls = append(r.calls, name)
		return nil
	}
}

func (r *recorder) take() []string {
	calls := r.calls
	r.calls = nil
	return calls
}

func TestDispatchPatternRouting(t *testing.T) {
	patterns := []string{
		"user.created", "user.*", "*.created", "*.*", "user", "*",
		"user.created.x", "a.*.c", "*.*.*", "a.b.c", "user.deleted", "a.b.*", "*.b",
	}
	d := domain.NewEventDispatcher()
	rec := &recorder{}
	for _, p := range patterns {
		require.NoError(t, domain.Subscribe(d, p, domain.EventHandler[any](rec.handler(p))))
	}

	tests := []struct {
		eventType string
		want      []string // in registration order
	}{
		{"user.created", []string{"user.created", "user.*", "*.created", "*.*"}},
		{"user.deleted", []string{"user.*", "*.*", "user.deleted"}},
		{"order.created", []string{"*.created", "*.*"}},
		{"user", []string{"user", "*"}},
		{"order", []string{"*"}},
		{"user.created.x", []string{"user.created.x", "*.*.*"}},
		{"a.b.c", []string{"a.*.c", "*.*.*", "a.b.c", "a.b.*"}},
		{"a.x.c", []string{"a.*.c", "*.*.*"}},
		{"a.b", []string{"*.*", "*.b"}},
		{"a.b.c.d", nil},
		{"User.Created", []string{"*.*"}}, // case-sensitive
		{"usercreated", []string{"*"}},
	}
	for _, tt := range tests {
		t.Run(tt.eventType, func(t *testing.T) {
			require.NoError(t, d.Dispatch(t.Context(), envelope(tt.eventType, nil)))
			require.Equal(t, tt.want, rec.take())
			// Again: the second dispatch is served from the route cache.
			require.NoError(t, d.Dispatch(t.Context(), envelope(tt.eventType, nil)))
			require.Equal(t, tt.want, rec.take())
		})
	}
}

func TestDispatchWildcardHandlersGetEveryEvent(t *testing.T) {
	d := domain.NewEventDispatcher()
	var got []string
	require.NoError(t, d.SubscribeWildcard(func(_ context.Context, env domain.EventEnvelope[any]) error {
		got = append(got, env.EventType)
		return nil
	}))
	types := []string{"user.created", "a", "a.b.c.d.e", "*", "x.*", "odd..type", ".", ""}
	for _, et := range types {
		require.NoError(t, d.Dispatch(t.Context(), envelope(et, nil)))
	}
	require.Equal(t, types, got)
}

func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	// "goroutine 123 [running]: ..."
	return string(bytes.Fields(buf)[1])
}

type ctxKey struct{}

func TestDispatchSequentialInRegistrationOrderOnCallersGoroutine(t *testing.T) {
	d := domain.NewEventDispatcher()
	caller := goroutineID()
	var (
		order    []string
		inFlight atomic.Int32
	)
	handler := func(name string) func(context.Context, domain.EventEnvelope[any]) error {
		return func(ctx context.Context, env domain.EventEnvelope[any]) error {
			require.Equal(t, int32(1), inFlight.Add(1), "handler %s overlaps another handler", name)
			defer inFlight.Add(-1)
			require.Equal(t, caller, goroutineID(), "handler %s runs on another goroutine", name)
			require.Equal(t, "tx-value", ctx.Value(ctxKey{}), "handler %s did not get the caller's context", name)
			time.Sleep(time.Millisecond) // widen the window for overlaps
			order = append(order, name)
			return nil
		}
	}
	typed := func(name string) domain.EventHandler[userCreated] {
		h := handler(name)
		return func(ctx context.Context, env domain.EventEnvelope[userCreated]) error {
			require.Equal(t, "user-1", env.Payload.UserID)
			return h(ctx, domain.ToAnyEnvelope(env))
		}
	}

	require.NoError(t, d.SubscribeWildcard(handler("wild-1")))
	require.NoError(t, domain.Subscribe(d, "user.created", typed("exact-1")))
	require.NoError(t, domain.Subscribe(d, "*.*", domain.EventHandler[any](handler("star-star"))))
	require.NoError(t, d.SubscribeWildcard(handler("wild-2")))
	require.NoError(t, domain.Subscribe(d, "user.deleted", domain.EventHandler[any](handler("other"))))
	require.NoError(t, domain.Subscribe(d, "user.*", typed("user-star")))
	require.NoError(t, domain.Subscribe(d, "user.created", typed("exact-2")))
	require.NoError(t, d.SubscribeWildcard(handler("wild-3")))

	ctx := context.WithValue(t.Context(), ctxKey{}, "tx-value")
	require.NoError(t, d.Dispatch(ctx, envelope("user.created", map[string]any{"user_id": "user-1"})))
	require.Equal(t, []string{"wild-1", "exact-1", "star-star", "wild-2", "user-star", "exact-2", "wild-3"}, order)
}

type codedError struct{ code int }

func (e *codedError) Error() string { return "coded " + strconv.Itoa(e.code) }

func TestDispatchFirstErrorStopsAndIsWrapped(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name     string
		register func(d *domain.EventDispatcher, h func(context.Context, domain.EventEnvelope[any]) error) error
	}{
		{"wildcard", func(d *domain.EventDispatcher, h func(context.Context, domain.EventEnvelope[any]) error) error {
			return d.SubscribeWildcard(h)
		}},
		{"pattern", func(d *domain.EventDispatcher, h func(context.Context, domain.EventEnvelope[any]) error) error {
			return domain.Subscribe(d, "order.*", domain.EventHandler[any](h))
		}},
		{"typed", func(d *domain.EventDispatcher, h func(context.Context, domain.EventEnvelope[any]) error) error {
			return domain.Subscribe(d, "order.placed", func(ctx context.Context, env domain.EventEnvelope[userCreated]) error {
				return h(ctx, domain.ToAnyEnvelope(env))
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := domain.NewEventDispatcher()
			rec := &recorder{}
			require.NoError(t, d.SubscribeWildcard(rec.handler("before")))
			require.NoError(t, tt.register(d, func(context.Context, domain.EventEnvelope[any]) error {
				rec.calls = append(rec.calls, "failing")
				return fmt.Errorf("handler: %w", errBoom)
			}))
			require.NoError(t, d.SubscribeWildcard(rec.handler("after")))
			require.NoError(t, domain.Subscribe(d, "order.placed", domain.EventHandler[any](rec.handler("after-typed"))))

			env := envelope("order.placed", map[string]any{"user_id": "u"})
			env.ID = "0190c2a4-0000-7000-8000-000000000001"
			err := d.Dispatch(t.Context(), env)
			require.Error(t, err)
			require.ErrorIs(t, err, errBoom)
			require.Contains(t, err.Error(), env.ID)
			require.Contains(t, err.Error(), "order.placed")
			require.Equal(t, []string{"before", "failing"}, rec.calls, "handlers after the failing one must not run")
		})
	}

	t.Run("errors.As finds a typed error", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
			return &codedError{code: 42}
		}))
		err := d.Dispatch(t.Context(), envelope("x.y", nil))
		var ce *codedError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, 42, ce.code)
	})

	t.Run("context cancellation error is preserved", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		require.NoError(t, d.SubscribeWildcard(func(ctx context.Context, _ domain.EventEnvelope[any]) error {
			return ctx.Err()
		}))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, d.Dispatch(ctx, envelope("x.y", nil)), context.Canceled)
	})
}

func TestSubscribeRejectsBadInput(t *testing.T) {
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	badPatterns := []string{"", ".", "..", "a.", ".a", "a..b", "a.b.", "*.", ".*", "*..*"}
	for _, p := range badPatterns {
		t.Run("pattern "+strconv.Quote(p), func(t *testing.T) {
			d := domain.NewEventDispatcher()
			var err error
			require.NotPanics(t, func() { err = domain.Subscribe(d, p, domain.EventHandler[any](noop)) })
			require.ErrorIs(t, err, domain.ErrInvalidEvent)
			require.NotPanics(t, func() {
				err = domain.Subscribe(d, p, func(context.Context, domain.EventEnvelope[userCreated]) error { return nil })
			})
			require.ErrorIs(t, err, domain.ErrInvalidEvent)

			// Nothing was registered.
			called := false
			require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
				called = true
				return nil
			}))
			require.NoError(t, d.Dispatch(t.Context(), envelope(p, nil)))
			require.True(t, called)
		})
	}

	t.Run("nil typed handler", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		var err error
		require.NotPanics(t, func() { err = domain.Subscribe[userCreated](d, "user.created", nil) })
		require.Error(t, err)
		require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", nil)), "nothing was registered")
	})
	t.Run("nil wildcard handler", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		var err error
		require.NotPanics(t, func() { err = d.SubscribeWildcard(nil) })
		require.Error(t, err)
		require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", nil)), "nothing was registered")
	})
	t.Run("nil dispatcher", func(t *testing.T) {
		var d *domain.EventDispatcher
		require.NotPanics(t, func() {
			require.Error(t, domain.Subscribe(d, "user.created", domain.EventHandler[any](noop)))
			require.Error(t, d.SubscribeWildcard(noop))
			err := d.Dispatch(t.Context(), envelope("user.created", nil))
			require.Error(t, err)
			require.Contains(t, err.Error(), "evt-user.created")
		})
	})
}

func TestZeroValueDispatcher(t *testing.T) {
	t.Run("var", func(t *testing.T) {
		var d domain.EventDispatcher
		require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", nil)), "empty dispatcher")
		var got []string
		require.NoError(t, domain.Subscribe(&d, "user.*", func(_ context.Context, env domain.EventEnvelope[userCreated]) error {
			got = append(got, env.Payload.UserID)
			return nil
		}))
		require.NoError(t, d.SubscribeWildcard(func(_ context.Context, env domain.EventEnvelope[any]) error {
			got = append(got, "wild:"+env.EventType)
			return nil
		}))
		require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", &userCreated{UserID: "u-1"})))
		require.Equal(t, []string{"u-1", "wild:user.created"}, got)
	})
	t.Run("new", func(t *testing.T) {
		d := new(domain.EventDispatcher)
		called := false
		require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
			called = true
			return nil
		}))
		require.NoError(t, d.Dispatch(t.Context(), envelope("a", nil)))
		require.True(t, called)
	})
}

func TestDispatchUnmatchedEventIsNotAnError(t *testing.T) {
	d := domain.NewEventDispatcher()
	called := false
	require.NoError(t, domain.Subscribe(d, "user.created", func(context.Context, domain.EventEnvelope[userCreated]) error {
		called = true
		return errors.New("must not run")
	}))
	for _, et := range []string{"order.created", "user", "user.created.x", "user.deleted", ""} {
		require.NoError(t, d.Dispatch(t.Context(), envelope(et, map[string]any{"user_id": 1})), et)
	}
	require.False(t, called)
}

// TestDispatchSeesLaterRegistrations checks that the route cache is
// invalidated by a registration after a Dispatch of the same type.
func TestDispatchSeesLaterRegistrations(t *testing.T) {
	d := domain.NewEventDispatcher()
	rec := &recorder{}
	require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", nil)))
	require.NoError(t, domain.Subscribe(d, "user.created", domain.EventHandler[any](rec.handler("first"))))
	require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", nil)))
	require.Equal(t, []string{"first"}, rec.take())
	require.NoError(t, domain.Subscribe(d, "*.created", domain.EventHandler[any](rec.handler("second"))))
	require.NoError(t, d.SubscribeWildcard(rec.handler("third")))
	require.NoError(t, d.Dispatch(t.Context(), envelope("user.created", nil)))
	require.Equal(t, []string{"first", "second", "third"}, rec.take())
}

// TestDispatchManyEventTypes goes past the route cache's bound: routing
// stays correct when the cache is reset.
func TestDispatchManyEventTypes(t *testing.T) {
	d := domain.NewEventDispatcher()
	var exact, star, wild int
	require.NoError(t, domain.Subscribe(d, "t.5000", domain.EventHandler[any](func(context.Context, domain.EventEnvelope[any]) error {
		exact++
		return nil
	})))
	require.NoError(t, domain.Subscribe(d, "t.*", domain.EventHandler[any](func(context.Context, domain.EventEnvelope[any]) error {
		star++
		return nil
	})))
	require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
		wild++
		return nil
	}))
	const n = 10000
	for round := range 2 {
		for i := range n {
			require.NoError(t, d.Dispatch(t.Context(), envelope("t."+strconv.Itoa(i), nil)))
		}
		require.Equal(t, round+1, exact)
		require.Equal(t, (round+1)*n, star)
		require.Equal(t, (round+1)*n, wild)
	}
}

// TestHandlerMayRegisterDuringDispatch: a handler that subscribes another
// handler must not deadlock; the new handler is not part of the running
// dispatch but gets the next one.
func TestHandlerMayRegisterDuringDispatch(t *testing.T) {
	d := domain.NewEventDispatcher()
	rec := &recorder{}
	require.NoError(t, d.SubscribeWildcard(func(ctx context.Context, env domain.EventEnvelope[any]) error {
		rec.calls = append(rec.calls, "registrar")
		return domain.Subscribe(d, env.EventType, domain.EventHandler[any](rec.handler("added")))
	}))
	done := make(chan error, 1)
	go func() { done <- d.Dispatch(context.Background(), envelope("a.b", nil)) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Dispatch deadlocked when a handler registered another handler")
	}
	require.Equal(t, []string{"registrar"}, rec.take())
	require.NoError(t, d.Dispatch(t.Context(), envelope("a.b", nil)))
	require.Equal(t, []string{"registrar", "added"}, rec.take())
}

func TestHandlerPanicPropagates(t *testing.T) {
	d := domain.NewEventDispatcher()
	after := false
	require.NoError(t, domain.Subscribe(d, "user.created", func(context.Context, domain.EventEnvelope[userCreated]) error {
		panic("handler exploded")
	}))
	require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
		after = true
		return nil
	}))
	require.PanicsWithValue(t, "handler exploded", func() {
		_ = d.Dispatch(t.Context(), envelope("user.created", nil))
	})
	require.False(t, after)

	// No lock is left held: the dispatcher keeps working.
	require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error { return nil }))
	require.NoError(t, d.Dispatch(t.Context(), envelope("order.created", nil)))
	require.True(t, after)
}

func TestConcurrentRegistrationAndDispatch(t *testing.T) {
	d := domain.NewEventDispatcher()
	var wildCalls atomic.Int64
	require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
		wildCalls.Add(1)
		return nil
	}))

	const (
		registrars   = 4
		perRegistrar = 50
		dispatchers  = 4
		perDispatch  = 300
	)
	var (
		wg        sync.WaitGroup
		counts    [registrars * perRegistrar]atomic.Int64
		errsMu    sync.Mutex
		errs      []error
		dispatchN atomic.Int64
	)
	fail := func(err error) {
		errsMu.Lock()
		errs = append(errs, err)
		errsMu.Unlock()
	}
	for r := range registrars {
		wg.Go(func() {
			for i := range perRegistrar {
				n := r*perRegistrar + i
				own := fmt.Sprintf("own.%d", n)
				var err error
				if n%2 == 0 {
					err = domain.Subscribe(d, own, func(_ context.Context, env domain.EventEnvelope[userCreated]) error {
						counts[n].Add(1)
						return nil
					})
				} else {
					err = domain.Subscribe(d, "*.*", domain.EventHandler[any](func(_ context.Context, env domain.EventEnvelope[any]) error {
						if env.EventType == own {
							counts[n].Add(1)
						}
						return nil
					}))
				}
				if err != nil {
					fail(err)
					return
				}
				// A Dispatch that starts after Subscribe returned sees the
				// new handler.
				if err := d.Dispatch(context.Background(), envelope(own, map[string]any{"user_id": own})); err != nil {
					fail(err)
					return
				}
				if got := counts[n].Load(); got != 1 {
					fail(fmt.Errorf("handler %d ran %d times for its own event, want 1", n, got))
				}
			}
		})
	}
	for g := range dispatchers {
		wg.Go(func() {
			for i := range perDispatch {
				et := []string{"user.created", "order.placed", "x", "own.none"}[(g+i)%4]
				if err := d.Dispatch(context.Background(), envelope(et, map[string]any{"user_id": "u"})); err != nil {
					fail(err)
					return
				}
				dispatchN.Add(1)
			}
		})
	}
	wg.Wait()
	require.Empty(t, errs)
	require.Equal(t, int64(registrars*perRegistrar)+dispatchN.Load(), wildCalls.Load())
	for n := range counts {
		require.Equal(t, int64(1), counts[n].Load(), "handler %d", n)
	}
}

// orderPlaced is the payload type of the typed-decoding tests.
type orderPlaced struct {
	OrderID string            `json:"order_id"`
	Amount  float64           `json:"amount"`
	Items   []string          `json:"items"`
	Lines   []orderLine       `json:"lines"`
	Tags    map[string]string `json:"tags,omitempty"`
	Note    *string           `json:"note"`
}

type orderLine struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

func TestTypedHandlerDecodesPayloads(t *testing.T) {
	note := "gift"
	want := orderPlaced{
		OrderID: "o-1",
		Amount:  12.5,
		Items:   []string{"a", "b"},
		Lines:   []orderLine{{SKU: "s-1", Qty: 2}},
		Tags:    map[string]string{"k": "v"},
		Note:    &note,
	}
	rawJSON := `{"order_id":"o-1","amount":12.5,"items":["a","b"],"lines":[{"sku":"s-1","qty":2}],"tags":{"k":"v"},"note":"gift"}`
	var decodedMap map[string]any
	require.NoError(t, json.Unmarshal([]byte(rawJSON), &decodedMap))
	var decodedAny any
	require.NoError(t, json.Unmarshal([]byte(rawJSON), &decodedAny))

	tests := []struct {
		name    string
		payload any
		want    orderPlaced
	}{
		{"map[string]any", decodedMap, want},
		{"any holding a decoded object", decodedAny, want},
		{"json.RawMessage", json.RawMessage(rawJSON), want},
		{"[]byte JSON", []byte(rawJSON), want},
		{"[]byte JSON with surrounding whitespace", []byte(" \n" + rawJSON + "\t "), want},
		{"*T", &want, want},
		{"T", want, want},
		{"nil", nil, orderPlaced{}},
		{"nil *T", (*orderPlaced)(nil), orderPlaced{}},
		{"JSON null", json.RawMessage("null"), orderPlaced{}},
		{"[]byte null", []byte("null"), orderPlaced{}},
		{"partial map", map[string]any{"order_id": "o-2"}, orderPlaced{OrderID: "o-2"}},
		{"unknown fields are ignored", map[string]any{"order_id": "o-3", "extra": true}, orderPlaced{OrderID: "o-3"}},
		{"different struct with the same JSON shape", struct {
			OrderID string `json:"order_id"`
			Amount  int    `json:"amount"`
		}{"o-4", 3}, orderPlaced{OrderID: "o-4", Amount: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := domain.NewEventDispatcher()
			var got []domain.EventEnvelope[orderPlaced]
			require.NoError(t, domain.Subscribe(d, "order.placed", func(_ context.Context, env domain.EventEnvelope[orderPlaced]) error {
				got = append(got, env)
				return nil
			}))
			env := envelope("order.placed", tt.payload)
			env.Created = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
			env.TransactionID = "tx-1"
			env.Position = 77
			env.SequenceNo = 5
			env.Metadata = map[string]any{"trace": "t-1"}
			require.NoError(t, d.Dispatch(t.Context(), env))
			require.Len(t, got, 1)
			require.Equal(t, domain.EventEnvelope[orderPlaced]{
				ID:            env.ID,
				AggregateID:   env.AggregateID,
				EventType:     env.EventType,
				Payload:       tt.want,
				Created:       env.Created,
				SequenceNo:    5,
				TransactionID: "tx-1",
				Metadata:      map[string]any{"trace": "t-1"},
				Position:      77,
			}, got[0])
		})
	}
}

func TestTypedHandlerOtherTypes(t *testing.T) {
	ctx := t.Context()
	t.Run("pointer type from map", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		var got *orderPlaced
		require.NoError(t, domain.Subscribe(d, "o.p", func(_ context.Context, env domain.EventEnvelope[*orderPlaced]) error {
			got = env.Payload
			return nil
		}))
		require.NoError(t, d.Dispatch(ctx, envelope("o.p", map[string]any{"order_id": "o-9"})))
		require.NotNil(t, got)
		require.Equal(t, "o-9", got.OrderID)
	})
	t.Run("pointer type passes the same pointer", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		var got *orderPlaced
		require.NoError(t, domain.Subscribe(d, "o.p", func(_ context.Context, env domain.EventEnvelope[*orderPlaced]) error {
			got = env.Payload
			return nil
		}))
		p := &orderPlaced{OrderID: "same"}
		require.NoError(t, d.Dispatch(ctx, envelope("o.p", p)))
		require.Same(t, p, got)
	})
	t.Run("any gets the payload as is", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		var got any
		require.NoError(t, domain.Subscribe(d, "o.p", func(_ context.Context, env domain.EventEnvelope[any]) error {
			got = env.Payload
			return nil
		}))
		raw := json.RawMessage(`{"a":1}`)
		require.NoError(t, d.Dispatch(ctx, envelope("o.p", raw)))
		require.Equal(t, raw, got)
	})
	t.Run("scalar and slice types", func(t *testing.T) {
		d := domain.NewEventDispatcher()
		var (
			s  string
			n  []int
			f  float64
			mp map[string]int
		)
		require.NoError(t, domain.Subscribe(d, "s", func(_ context.Context, env domain.EventEnvelope[string]) error {
			s = env.Payload
			return nil
		}))
		require.NoError(t, domain.Subscribe(d, "n", func(_ context.Context, env domain.EventEnvelope[[]int]) error {
			n = env.Payload
			return nil
		}))
		require.NoError(t, domain.Subscribe(d, "f", func(_ context.Context, env domain.EventEnvelope[float64]) error {
			f = env.Payload
			return nil
		}))
		require.NoError(t, domain.Subscribe(d, "m", func(_ context.Context, env domain.EventEnvelope[map[string]int]) error {
			mp = env.Payload
			return nil
		}))
		require.NoError(t, d.Dispatch(ctx, envelope("s", []byte(`"hello"`))))
		require.Equal(t, "hello", s)
		require.NoError(t, d.Dispatch(ctx, envelope("n", []any{1.0, 2.0, 3.0})))
		require.Equal(t, []int{1, 2, 3}, n)
		require.NoError(t, d.Dispatch(ctx, envelope("f", 3))) // an int becomes a float64 through JSON
		require.Equal(t, 3.0, f)
		require.NoError(t, d.Dispatch(ctx, envelope("m", map[string]any{"a": 1.0})))
		require.Equal(t, map[string]int{"a": 1}, mp)
	})
}

func TestTypedHandlerUndecodablePayload(t *testing.T) {
	tests := []struct {
		name        string
		payload     any
		payloadType string
	}{
		{"wrong field type in map", map[string]any{"order_id": 12}, "map[string]interface {}"},
		{"wrong nested type", map[string]any{"lines": []any{map[string]any{"qty": "two"}}}, "map[string]interface {}"},
		{"array for a struct", []any{1.0, 2.0}, "[]interface {}"},
		{"string for a struct", "just a string", "string"},
		{"number for a struct", 42, "int"},
		{"invalid json.RawMessage", json.RawMessage(`{"order_id":`), "json.RawMessage"},
		{"empty json.RawMessage", json.RawMessage{}, "json.RawMessage"},
		{"json.RawMessage with trailing data", json.RawMessage(`{"order_id":"o-1"} {}`), "json.RawMessage"},
		{"[]byte with trailing data", []byte(`{"order_id":"o-1"}x`), "[]uint8"},
		{"[]byte that is not JSON", []byte("not json at all"), "[]uint8"},
		{"empty []byte", []byte{}, "[]uint8"},
		{"unencodable payload", map[string]any{"ch": make(chan int)}, "map[string]interface {}"},
		{"unencodable float", map[string]any{"amount": float64NaN()}, "map[string]interface {}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := domain.NewEventDispatcher()
			called, after := false, false
			require.NoError(t, domain.Subscribe(d, "order.*", func(context.Context, domain.EventEnvelope[orderPlaced]) error {
				called = true
				return nil
			}))
			require.NoError(t, d.SubscribeWildcard(func(context.Context, domain.EventEnvelope[any]) error {
				after = true
				return nil
			}))
			env := envelope("order.placed", tt.payload)
			env.ID = "evt-undecodable-1"
			var err error
			require.NotPanics(t, func() { err = d.Dispatch(t.Context(), env) })
			require.Error(t, err)
			require.ErrorIs(t, err, domain.ErrInvalidEvent)
			msg := err.Error()
			require.Contains(t, msg, "evt-undecodable-1")
			require.Contains(t, msg, `"order.placed"`)
			require.Contains(t, msg, tt.payloadType, "the payload's type")
			require.Contains(t, msg, "domain_test.orderPlaced", "the handler's type")
			require.False(t, called, "the handler must not run with a zero payload")
			require.False(t, after, "the failed decode stops the dispatch")
		})
	}

	t.Run("string handler rejects a non-JSON []byte", func(t *testing.T) {
		// A []byte payload is raw JSON; bytes that are not JSON are an
		// error, not silently handed over as their base64 text.
		d := domain.NewEventDispatcher()
		called := false
		require.NoError(t, domain.Subscribe(d, "s", func(_ context.Context, env domain.EventEnvelope[string]) error {
			called = true
			return nil
		}))
		err := d.Dispatch(t.Context(), envelope("s", []byte("abc")))
		require.ErrorIs(t, err, domain.ErrInvalidEvent)
		require.False(t, called)
	})
}

func float64NaN() float64 {
	zero := 0.0
	return zero / zero
}

// TestDispatchErrorMessage pins the shape of a handler error so that logs
// name the event.
func TestDispatchErrorMessage(t *testing.T) {
	d := domain.NewEventDispatcher()
	require.NoError(t, domain.Subscribe(d, "user.created", func(context.Context, domain.EventEnvelope[userCreated]) error {
		return errors.New("db down")
	}))
	env := envelope("user.created", nil)
	env.ID = "evt-42"
	err := d.Dispatch(t.Context(), env)
	require.Error(t, err)
	msg := err.Error()
	require.True(t, strings.Contains(msg, "evt-42") && strings.Contains(msg, "user.created") && strings.HasSuffix(msg, "db down"), msg)
}
