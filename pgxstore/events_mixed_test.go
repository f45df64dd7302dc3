package pgxstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// mixedPayloads are payloads of every JSON kind, and values whose
// encoding a careless backend would change.
var mixedPayloads = []any{
	map[string]any{"name": "ann", "n": 1, "nested": map[string]any{"list": []any{1.5, "x", nil, true}}},
	[]any{},
	map[string]any{},
	"unicode \u00e9\u4e16 \"quoted\" \\ <tag> &",
	int64(9007199254740992),
	-0.25,
	math.MaxFloat64,
	nil,
	false,
	json.RawMessage(`{"b":1,"a":[1e2,1.50]}`),
	[]byte{0, 1, 2, 255},
	struct {
		A string `json:"a"`
		B []int  `json:"b"`
	}{"x", []int{3, 2, 1}},
}

// TestMixedStoresReadEachOthersEvents appends through a GormEventStore
// and this package's store on one schema, alternately: each reads the
// other's events exactly as its own, the stored JSON is the same text
// whichever store wrote it, and versions, retries and conflicts are
// decided across the two.
func TestMixedStoresReadEachOthersEvents(t *testing.T) {
	ctx := testCtx(t)
	pgxStore, pg := newEventStore(t)
	gormStore := newGormEventStore(t, pg)
	stores := []domain.EventStore{pgxStore, gormStore}

	var written []domain.EventEnvelope[any]
	for i, payload := range mixedPayloads {
		for w, s := range stores {
			agg := "mixed-" + string(rune('a'+i))
			e := feedtest.NewEvent(agg, "mixed.kind", payload)
			e.TransactionID = "mixed-tx"
			e.Metadata = map[string]any{"writer": float64(w), "trace": "t-1", "deep": map[string]any{"k": []any{"v"}}}
			e.Created = time.Date(2026, 3, 4, 5, 6, 7, 891234567, time.FixedZone("x", 3600))
			require.NoError(t, s.Append(ctx, agg, w, e), "writer %d, payload %d", w, i)
			written = append(written, e)
		}
	}

	for _, reader := range stores {
		feed, err := reader.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Equal(t, feedtest.IDs(written), feedtest.IDs(feed), "%T reads both writers' events in order", reader)
		feedtest.RequireStrictlyIncreasing(t, feed)
		for _, e := range feed {
			byID, err := reader.GetEventByID(ctx, e.ID)
			require.NoError(t, err)
			require.Equal(t, e, byID)
			require.True(t, time.Date(2026, 3, 4, 4, 6, 7, 891234000, time.UTC).Equal(e.Created))
		}
		byTx, err := reader.GetEventsByTransactionID(ctx, "mixed-tx")
		require.NoError(t, err)
		require.Len(t, byTx, len(written))
	}
	pgxFeed, err := pgxStore.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	gormFeed, err := gormStore.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, gormFeed, pgxFeed, "both stores read every event identically")
	for i := 0; i < len(pgxFeed); i += 2 {
		// The same payload, written once by each store.
		require.Equal(t, pgxFeed[i].Payload, pgxFeed[i+1].Payload, "payload %d", i/2)
	}

	// The stored text: jsonb normalises, so equal values are equal text
	// whichever store wrote them.
	conn := pgfeed.Connect(t, pg.DSN)
	rows, err := conn.Query(ctx, "SELECT payload::text, metadata - 'writer' FROM events ORDER BY position")
	require.NoError(t, err)
	type stored struct {
		payload *string
		meta    map[string]any
	}
	texts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		return s, r.Scan(&s.payload, &s.meta)
	})
	require.NoError(t, err)
	for i := 0; i < len(texts); i += 2 {
		require.Equal(t, texts[i], texts[i+1], "payload %d is stored as the same JSON by both stores", i/2)
	}

	// Versions, retries and conflicts across the stores.
	first := feedtest.NewEvent("shared", "opened", map[string]any{"n": 1})
	require.NoError(t, gormStore.Append(ctx, "shared", 0, first))
	require.ErrorIs(t, pgxStore.Append(ctx, "shared", 0, feedtest.NewEvent("shared", "opened", nil)), domain.ErrConcurrencyConflict)
	retry := first
	retry.Metadata = map[string]any{"attempt": 2.0}
	require.ErrorIs(t, pgxStore.Append(ctx, "shared", 0, retry), domain.ErrAlreadyAppended, "a retry through the other store is recognised")
	second := feedtest.NewEvent("shared", "deposited", []any{1.5})
	require.NoError(t, pgxStore.Append(ctx, "shared", 1, second))
	require.ErrorIs(t, gormStore.Append(ctx, "shared", 1, second), domain.ErrAlreadyAppended)
	changed := second
	changed.Payload = []any{2.5}
	require.ErrorIs(t, gormStore.Append(ctx, "shared", 1, changed), domain.ErrInvalidEvent)
	for _, s := range stores {
		v, err := s.GetCurrentVersion(ctx, "shared")
		require.NoError(t, err)
		require.Equal(t, 2, v)
	}
}

// TestValidationMatchesGorm gives both stores the same bad appends: each
// refuses every one with the same error, the pgx store's prefixed with
// its package's name.
func TestValidationMatchesGorm(t *testing.T) {
	ctx := testCtx(t)
	pgxStore, pg := newEventStore(t)
	gormStore := newGormEventStore(t, pg)
	ok := feedtest.NewEvent("agg", "ok", map[string]any{"n": 1})
	require.NoError(t, pgxStore.Append(ctx, "agg", 0, ok))
	with := func(change func(e *domain.EventEnvelope[any])) domain.EventEnvelope[any] {
		e := feedtest.NewEvent("agg", "t", map[string]any{"n": 2})
		change(&e)
		return e
	}
	cases := []struct {
		name     string
		agg      string
		expected int
		events   []domain.EventEnvelope[any]
	}{
		{"empty aggregate", "", -1, []domain.EventEnvelope[any]{feedtest.NewEvent("", "t", nil)}},
		{"long aggregate", strings.Repeat("a", pgxstore.MaxIdentifierBytes+1), -1, nil},
		{"bad expected version", "agg", -2, nil},
		{"stale version", "agg", 0, []domain.EventEnvelope[any]{with(func(*domain.EventEnvelope[any]) {})}},
		{"stale version without events", "agg", 3, nil},
		{"empty event type", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.EventType = "" })}},
		{"NUL in a payload", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = "a\x00b" })}},
		{"invalid UTF-8", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = "\xff" })}},
		{"unencodable", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = make(chan int) })}},
		{"other aggregate", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.AggregateID = "other" })}},
		{"sequence gap", "agg", -1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.SequenceNo = 5 })}},
		{"sequence stored", "agg", -1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.SequenceNo = 1 })}},
		{"stored ID, other content", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.ID = ok.ID })}},
		{"same ID twice", "agg", 1, []domain.EventEnvelope[any]{ok, ok}},
		{"created out of range", "agg", 1, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Created = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) })}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gormErr := gormStore.Append(ctx, c.agg, c.expected, c.events...)
			pgxErr := pgxStore.Append(ctx, c.agg, c.expected, c.events...)
			require.Error(t, gormErr)
			require.Error(t, pgxErr)
			for _, sentinel := range []error{domain.ErrInvalidEvent, domain.ErrConcurrencyConflict, domain.ErrAlreadyAppended} {
				require.Equal(t, errors.Is(gormErr, sentinel), errors.Is(pgxErr, sentinel), "%v", sentinel)
			}
			require.Equal(t, "pgxstore: "+gormErr.Error(), pgxErr.Error())
		})
	}
	feed, err := pgxStore.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{ok.ID}, feedtest.IDs(feed), "nothing else was stored")
}

// TestNotifyAfterCommit: a LISTEN session on the store's channel is
// notified after each append commits, on the default channel and on one
// WithNotifyChannel chose.
func TestNotifyAfterCommit(t *testing.T) {
	for _, channel := range []string{"", "pgxstore events \"quoted\""} {
		t.Run("channel "+channel, func(t *testing.T) {
			ctx := testCtx(t)
			var opts []pgxstore.Option
			want := pgxstore.DefaultNotifyChannel
			if channel != "" {
				opts = append(opts, pgxstore.WithNotifyChannel(channel))
				want = channel
			}
			store, pg := newEventStore(t, opts...)
			listener := pgfeed.Connect(t, pg.DSN)
			_, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{want}.Sanitize())
			require.NoError(t, err)
			for i := range 2 {
				require.NoError(t, store.Append(ctx, "notified", i, feedtest.NewEvent("notified", "x", i)))
				n, err := listener.WaitForNotification(ctx)
				require.NoError(t, err)
				require.Equal(t, want, n.Channel)
				require.Empty(t, n.Payload)
			}
		})
	}
}

// TestNewEventStoreRefusesBadArguments: a nil pool and unusable channels
// are refused with an error, never a panic.
func TestNewEventStoreRefusesBadArguments(t *testing.T) {
	ctx := context.Background()
	_, err := pgxstore.NewEventStore(ctx, nil)
	require.ErrorContains(t, err, "pgxstore: NewEventStore: nil *pgxpool.Pool")
	_, pool := newDatabase(t)
	for _, channel := range []string{"", strings.Repeat("c", 64), "a\x00b"} {
		_, err := pgxstore.NewEventStore(ctx, pool, pgxstore.WithNotifyChannel(channel))
		require.ErrorContains(t, err, "pgxstore: NewEventStore: ")
		require.ErrorContains(t, err, "WithNotifyChannel")
	}
	s, err := pgxstore.NewEventStore(ctx, pool, pgxstore.WithNotifyChannel(strings.Repeat("c", 63)))
	require.NoError(t, err)
	require.NoError(t, s.Close())
}
