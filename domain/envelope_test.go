package domain_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

type userCreated struct {
	UserID string `json:"user_id"`
	Name   string `json:"name"`
}

// GetID has a pointer receiver that dereferences it: calling it on a nil
// *userCreated panics.
func (u *userCreated) GetID() string { return u.UserID }

type valueIdentified struct{ ID string }

// GetID has a value receiver: calling it through a nil *valueIdentified
// panics too (the runtime dereferences the pointer to copy the value).
func (v valueIdentified) GetID() string { return v.ID }

func TestNewEventEnvelopeFields(t *testing.T) {
	before := time.Now()
	env := domain.NewEventEnvelope(map[string]any{"k": 1}, "agg-1", "thing.happened", 7)
	after := time.Now()

	id, err := uuid.Parse(env.ID)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(7), id.Version())
	require.Equal(t, uuid.RFC4122, id.Variant())

	require.Equal(t, "agg-1", env.AggregateID)
	require.Equal(t, "thing.happened", env.EventType)
	require.Equal(t, 7, env.SequenceNo)
	require.Equal(t, map[string]any{"k": 1}, env.Payload)
	require.Empty(t, env.TransactionID)
	require.Zero(t, env.Position, "an envelope not yet persisted has no position")

	require.NotNil(t, env.Metadata)
	require.Empty(t, env.Metadata)
	env.Metadata["x"] = 1 // writable without a panic

	require.False(t, env.Created.IsZero())
	require.False(t, env.Created.Before(before.Add(-time.Millisecond)), "Created %v before %v", env.Created, before)
	require.False(t, env.Created.After(after.Add(time.Millisecond)), "Created %v after %v", env.Created, after)
	require.WithinDuration(t, time.Now(), env.Created, time.Minute)

	// The UUIDv7 embeds its creation time in milliseconds.
	sec, nsec := id.Time().UnixTime()
	require.WithinDuration(t, env.Created, time.Unix(sec, nsec), time.Second)
}

func TestNewEventEnvelopeIDsUniqueAndTimeOrdered(t *testing.T) {
	const n = 5000
	seen := make(map[string]bool, n)
	prev := ""
	for i := range n {
		env := domain.NewEventEnvelope(i, "agg", "t", i+1)
		id, err := uuid.Parse(env.ID)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), id.Version())
		require.False(t, seen[env.ID], "duplicate ID %s", env.ID)
		seen[env.ID] = true
		// Canonical UUID strings of a time-ordered UUIDv7 sort in creation
		// order, so IDs created one after another strictly increase.
		require.Greater(t, env.ID, prev, "ID #%d not after the previous one", i)
		prev = env.ID
	}
}

func TestNewEventEnvelopeIDsUniqueAcrossGoroutines(t *testing.T) {
	const workers, per = 8, 500
	ids := make(chan string, workers*per)
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for range per {
				ids <- domain.NewEventEnvelope("p", "agg", "t", 1).ID
			}
		}()
	}
	for range workers {
		<-done
	}
	close(ids)
	seen := make(map[string]bool, workers*per)
	for id := range ids {
		require.False(t, seen[id], "duplicate ID %s", id)
		seen[id] = true
	}
	require.Len(t, seen, workers*per)
}

func TestNewEventEnvelopeAggregateIDFromPayload(t *testing.T) {
	t.Run("pointer receiver", func(t *testing.T) {
		env := domain.NewEventEnvelope(&userCreated{UserID: "user-42"}, "ignored", "user.created", 1)
		require.Equal(t, "user-42", env.AggregateID)
	})
	t.Run("value receiver", func(t *testing.T) {
		env := domain.NewEventEnvelope(valueIdentified{ID: "v-1"}, "ignored", "v.created", 1)
		require.Equal(t, "v-1", env.AggregateID)
	})
	t.Run("value receiver through pointer", func(t *testing.T) {
		env := domain.NewEventEnvelope(&valueIdentified{ID: "v-2"}, "ignored", "v.created", 1)
		require.Equal(t, "v-2", env.AggregateID)
	})
	t.Run("payload typed as interface", func(t *testing.T) {
		var p any = &userCreated{UserID: "user-43"}
		env := domain.NewEventEnvelope(p, "ignored", "user.created", 1)
		require.Equal(t, "user-43", env.AggregateID)
	})
	t.Run("no GetID keeps the argument", func(t *testing.T) {
		env := domain.NewEventEnvelope(userCreated{UserID: "not-used"}, "agg-7", "user.created", 1)
		require.Equal(t, "agg-7", env.AggregateID, "GetID has a pointer receiver: a userCreated value has no GetID")
	})
	t.Run("empty GetID keeps the argument", func(t *testing.T) {
		env := domain.NewEventEnvelope(&userCreated{}, "agg-8", "user.created", 1)
		require.Equal(t, "agg-8", env.AggregateID)
	})
}

func TestNewEventEnvelopeNilPayloadsDoNotPanic(t *testing.T) {
	t.Run("nil pointer whose GetID dereferences", func(t *testing.T) {
		var p *userCreated
		require.NotPanics(t, func() {
			env := domain.NewEventEnvelope(p, "agg-1", "user.created", 1)
			require.Equal(t, "agg-1", env.AggregateID)
			require.Nil(t, env.Payload)
		})
	})
	t.Run("nil pointer to a value-receiver GetID", func(t *testing.T) {
		var p *valueIdentified
		require.NotPanics(t, func() {
			env := domain.NewEventEnvelope(p, "agg-2", "v.created", 1)
			require.Equal(t, "agg-2", env.AggregateID)
		})
	})
	t.Run("nil pointer inside an interface", func(t *testing.T) {
		var p any = (*userCreated)(nil)
		require.NotPanics(t, func() {
			env := domain.NewEventEnvelope(p, "agg-3", "user.created", 1)
			require.Equal(t, "agg-3", env.AggregateID)
		})
	})
	t.Run("nil interface", func(t *testing.T) {
		require.NotPanics(t, func() {
			env := domain.NewEventEnvelope[any](nil, "agg-4", "x.y", 1)
			require.Equal(t, "agg-4", env.AggregateID)
			require.Nil(t, env.Payload)
		})
	})
}

func TestToAnyEnvelopeCopiesEveryField(t *testing.T) {
	created := time.Date(2024, 5, 6, 7, 8, 9, 10, time.UTC)
	typed := domain.EventEnvelope[userCreated]{
		ID:            "evt-1",
		AggregateID:   "user-1",
		EventType:     "user.created",
		Payload:       userCreated{UserID: "user-1", Name: "Ada"},
		Created:       created,
		SequenceNo:    3,
		TransactionID: "tx-9",
		Metadata:      map[string]any{"source": "test"},
		Position:      12345,
	}
	got := domain.ToAnyEnvelope(typed)
	require.Equal(t, domain.EventEnvelope[any]{
		ID:            "evt-1",
		AggregateID:   "user-1",
		EventType:     "user.created",
		Payload:       userCreated{UserID: "user-1", Name: "Ada"},
		Created:       created,
		SequenceNo:    3,
		TransactionID: "tx-9",
		Metadata:      map[string]any{"source": "test"},
		Position:      12345,
	}, got)
	require.IsType(t, userCreated{}, got.Payload, "the payload keeps its dynamic type")
}

// TestToAnyEnvelopeNoFieldForgotten fills every field of EventEnvelope with a
// non-zero value by reflection, so a field added later and not copied by
// ToAnyEnvelope fails here.
func TestToAnyEnvelopeNoFieldForgotten(t *testing.T) {
	typed := domain.NewEventEnvelope("payload", "agg", "a.b", 4)
	typed.TransactionID = "tx"
	typed.Position = 99
	typed.Metadata["m"] = "v"
	requireNoZeroField(t, typed)

	got := domain.ToAnyEnvelope(typed)
	requireNoZeroField(t, got)
	require.Equal(t, typed.ID, got.ID)
	require.Equal(t, typed.AggregateID, got.AggregateID)
	require.Equal(t, typed.EventType, got.EventType)
	require.Equal(t, any("payload"), got.Payload)
	require.True(t, typed.Created.Equal(got.Created))
	require.Equal(t, typed.SequenceNo, got.SequenceNo)
	require.Equal(t, typed.TransactionID, got.TransactionID)
	require.Equal(t, typed.Metadata, got.Metadata)
	require.Equal(t, typed.Position, got.Position)
}

func TestToAnyEnvelopeNilPayload(t *testing.T) {
	got := domain.ToAnyEnvelope(domain.EventEnvelope[*userCreated]{ID: "e", Position: 1})
	require.Equal(t, "e", got.ID)
	require.Equal(t, int64(1), got.Position)
	require.Equal(t, (*userCreated)(nil), got.Payload)
}
