package domain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// EventHandler handles one event whose payload has been decoded into T.
type EventHandler[T any] func(ctx context.Context, envelope EventEnvelope[T]) error

// EventDispatcher routes envelopes to handlers registered for event-type
// patterns. Patterns are dot-separated and "*" matches exactly one segment:
// "user.created" is delivered to handlers of "user.created", "user.*",
// "*.created" and "*.*". Wildcard handlers (SubscribeWildcard) receive every
// event.
//
// Handlers run one after another, in registration order, on the goroutine
// that calls Dispatch. This is deliberate: the handlers of a subscriber share
// one database transaction (subscriptions.TxFromContext), and a
// transaction's connection must not be used from two goroutines at once.
//
// The zero value is ready to use. An EventDispatcher is safe for concurrent
// use: registration may race with Dispatch, and a Dispatch sees the handlers
// registered before it started.
type EventDispatcher struct {
	mu       sync.RWMutex
	handlers []registration
	// routes caches, per event type, the indexes of matching handlers in
	// registration order; it is rebuilt lazily after each registration.
	routes map[string][]int
}

type registration struct {
	pattern  []string // nil for wildcard handlers
	typeName string   // the handler's payload type, for error messages
	handle   func(context.Context, EventEnvelope[any]) error
}

// NewEventDispatcher returns an empty dispatcher. It is equivalent to
// new(EventDispatcher); the zero value is ready to use.
func NewEventDispatcher() *EventDispatcher {
	return &EventDispatcher{}
}

// Subscribe registers a typed handler for an event-type pattern. Events
// whose payload is not already a T (a map[string]any or raw JSON read back
// from a database) are decoded into T through their JSON form; a payload
// that cannot become a T makes Dispatch fail with an error naming the event
// and both types.
func Subscribe[T any](d *EventDispatcher, eventType string, handler EventHandler[T]) error {
	if d == nil {
		return errors.New("domain: Subscribe: nil dispatcher")
	}
	if handler == nil {
		return fmt.Errorf("domain: Subscribe %q: nil handler", eventType)
	}
	pattern, err := parsePattern(eventType)
	if err != nil {
		return err
	}
	typeName := reflect.TypeFor[T]().String()
	d.register(registration{
		pattern:  pattern,
		typeName: typeName,
		handle: func(ctx context.Context, env EventEnvelope[any]) error {
			typed, err := DecodeEnvelope[T](env)
			if err != nil {
				return err
			}
			return handler(ctx, typed)
		},
	})
	return nil
}

// DecodeEnvelope returns env with its payload as a T, decoded as Subscribe
// decodes it: directly when it already is one (or a non-nil *T), else
// through its JSON form (a map[string]any or raw JSON read back from a
// database). A payload that cannot become a T is an error wrapping
// ErrInvalidEvent that names the event and both types.
func DecodeEnvelope[T any](env EventEnvelope[any]) (EventEnvelope[T], error) {
	payload, err := decodePayload[T](env.Payload)
	if err != nil {
		return EventEnvelope[T]{}, fmt.Errorf("%w: event %s (type %q): payload of type %T cannot be decoded into %s: %v",
			ErrInvalidEvent, env.ID, env.EventType, env.Payload, reflect.TypeFor[T]().String(), err)
	}
	return EventEnvelope[T]{
		ID:            env.ID,
		AggregateID:   env.AggregateID,
		EventType:     env.EventType,
		Payload:       payload,
		Created:       env.Created,
		SequenceNo:    env.SequenceNo,
		TransactionID: env.TransactionID,
		Metadata:      env.Metadata,
		Position:      env.Position,
	}, nil
}

// SubscribeWildcard registers a handler that receives every event, in
// registration order with the pattern handlers.
func (d *EventDispatcher) SubscribeWildcard(handler func(context.Context, EventEnvelope[any]) error) error {
	if d == nil {
		return errors.New("domain: SubscribeWildcard: nil dispatcher")
	}
	if handler == nil {
		return errors.New("domain: SubscribeWildcard: nil handler")
	}
	d.register(registration{typeName: "any", handle: handler})
	return nil
}

func (d *EventDispatcher) register(r registration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handlers = append(d.handlers, r)
	d.routes = nil
}

// Dispatch delivers the envelope to every matching handler, sequentially and
// in registration order. The first error stops the dispatch and is returned
// wrapped with the event's type and ID (errors.Is still finds the handler's
// error). An event that no handler matches is not an error. A handler panic
// is not recovered: it propagates to the caller, which owns the goroutine.
//
// Dispatch has the subscriptions.Handler signature, so a dispatcher can be
// wired directly as a subscriber's handler.
func (d *EventDispatcher) Dispatch(ctx context.Context, envelope EventEnvelope[any]) error {
	if d == nil {
		return fmt.Errorf("domain: dispatch event %s (type %q): nil dispatcher", envelope.ID, envelope.EventType)
	}
	handlers, indexes := d.route(envelope.EventType)
	for _, i := range indexes {
		if err := handlers[i].handle(ctx, envelope); err != nil {
			return fmt.Errorf("dispatch event %s (type %q) to handler #%d (%s): %w",
				envelope.ID, envelope.EventType, i+1, handlers[i].typeName, err)
		}
	}
	return nil
}

// route returns a snapshot of the handlers and the indexes of those that
// match eventType, computing and caching the match list on first use.
func (d *EventDispatcher) route(eventType string) ([]registration, []int) {
	d.mu.RLock()
	handlers, indexes, ok := d.handlers, d.routes[eventType], d.routes != nil
	if ok {
		_, ok = d.routes[eventType]
	}
	d.mu.RUnlock()
	if ok {
		return handlers, indexes
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.routes == nil {
		d.routes = make(map[string][]int)
	}
	segments := strings.Split(eventType, ".")
	indexes = []int{}
	for i, h := range d.handlers {
		if h.pattern == nil || matchPattern(h.pattern, segments) {
			indexes = append(indexes, i)
		}
	}
	// Bound the cache: event types are normally a small closed set, but a
	// feed carrying arbitrary types must not grow memory without limit.
	if len(d.routes) >= maxCachedRoutes {
		d.routes = make(map[string][]int)
	}
	d.routes[eventType] = indexes
	return d.handlers, indexes
}

const maxCachedRoutes = 4096

func parsePattern(eventType string) ([]string, error) {
	if eventType == "" {
		return nil, fmt.Errorf("%w: empty event type pattern", ErrInvalidEvent)
	}
	segments := strings.Split(eventType, ".")
	for _, s := range segments {
		if s == "" {
			return nil, fmt.Errorf("%w: event type pattern %q has an empty segment", ErrInvalidEvent, eventType)
		}
	}
	return segments, nil
}

func matchPattern(pattern, segments []string) bool {
	if len(pattern) != len(segments) {
		return false
	}
	for i, p := range pattern {
		if p != "*" && p != segments[i] {
			return false
		}
	}
	return true
}

// decodePayload turns a payload into a T: directly when it already is one
// (or a non-nil *T), otherwise through its JSON form.
func decodePayload[T any](payload any) (T, error) {
	var zero T
	switch p := payload.(type) {
	case T:
		return p, nil
	case *T:
		if p != nil {
			return *p, nil
		}
		return zero, nil
	case nil:
		return zero, nil
	case json.RawMessage:
		return unmarshalInto[T](p)
	case []byte:
		// Raw JSON as a database driver returns it. Bytes that are not
		// valid JSON are an error: re-encoding them as a base64 JSON string
		// would hand a string handler garbage instead of failing.
		return unmarshalInto[T](p)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return zero, err
	}
	return unmarshalInto[T](raw)
}

// unmarshalInto decodes exactly one JSON value. json.Unmarshal, unlike a
// json.Decoder, rejects trailing data after the value.
func unmarshalInto[T any](raw []byte) (T, error) {
	var out T
	if err := json.Unmarshal(raw, &out); err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}
