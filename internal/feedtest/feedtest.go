// Package feedtest holds the event helpers that the module's test code
// shares: the exported conformance suites (package subscriptionstest), the
// event stores' tests (packages infrastructure and pgxstore) and the
// subscriber's tests (the root package): events, waits on asynchronous
// operations, a feed watcher and the follower test every store passes. Its
// Postgres half, which needs a server, is the subpackage pgfeed. It is
// test support only: it imports testing and testify, so no library or
// command package may import it.
//
// Every function is safe for concurrent use; none keeps what it is given.
package feedtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

var idCounter atomic.Int64

// UniqueID returns prefix with a number never returned before in this
// process, so that tests sharing a database do not collide.
func UniqueID(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, idCounter.Add(1))
}

// NewEvent returns an unpersisted envelope with a fresh ID and sequence
// number 0 (assigned by the store).
func NewEvent(aggregateID, eventType string, payload any) domain.EventEnvelope[any] {
	return domain.NewEventEnvelope[any](payload, aggregateID, eventType, 0)
}

// Context is a context that ends with the test (or after a generous
// safety deadline, so that a hang fails instead of blocking the run).
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// IDs returns the events' IDs in order.
func IDs(events []domain.EventEnvelope[any]) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// Positions returns the events' positions in order.
func Positions(events []domain.EventEnvelope[any]) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Position
	}
	return out
}

// SequenceNos returns the events' sequence numbers in order.
func SequenceNos(events []domain.EventEnvelope[any]) []int {
	out := make([]int, len(events))
	for i, e := range events {
		out[i] = e.SequenceNo
	}
	return out
}

// RequireStrictlyIncreasing fails unless positions increase strictly and
// are all positive.
func RequireStrictlyIncreasing(t testing.TB, events []domain.EventEnvelope[any]) {
	t.Helper()
	var last int64
	for i, e := range events {
		require.Greater(t, e.Position, last, "event #%d (%s) is not after the previous position", i, e.ID)
		last = e.Position
	}
}
