// Package eventrow is the one home of the events table's read side: the
// column list every read of whole events selects, the row those columns
// scan into, and its decoding into the envelope readers see. Package
// infrastructure's GormEventStore and the subscriptions package's Postgres
// read paths (the pipelined acquire, a partition's feed) share it, so a
// column or its decoding changes in one place and the public API carries
// no accessor for it. It also carries a GormEventStore's *gorm.DB to the
// subscriptions package (store.go) for the same reason.
//
// Everything here is stateless and safe for concurrent use.
package eventrow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
)

// Columns are the columns of a whole event, in the order of Row.Targets.
const Columns = "id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at"

// Select reads whole events from the events table; a caller appends its
// WHERE, ORDER BY and LIMIT.
const Select = "SELECT " + Columns + " FROM events "

// Row is one event as stored. Its fields are those of
// infrastructure.GormEventModel, the table's documented model, which
// converts to it.
type Row struct {
	ID            string    `gorm:"column:id"`
	AggregateID   string    `gorm:"column:aggregate_id"`
	EventType     string    `gorm:"column:event_type"`
	SequenceNo    int       `gorm:"column:sequence_no"`
	TransactionID string    `gorm:"column:transaction_id"`
	Position      int64     `gorm:"column:position"`
	Payload       []byte    `gorm:"column:payload"`
	Metadata      []byte    `gorm:"column:metadata"`
	CreatedAt     time.Time `gorm:"column:created_at"`
}

// Targets returns the scan destinations of Columns, for a driver-level
// scan (pgx) that does not go through GORM.
func (r *Row) Targets() []any {
	return []any{&r.ID, &r.AggregateID, &r.EventType, &r.SequenceNo, &r.TransactionID, &r.Position, &r.Payload, &r.Metadata, &r.CreatedAt}
}

// Envelope converts the row into the envelope readers see: payload and
// metadata decoded from JSON (objects as map[string]any, numbers as
// float64), Created in UTC, Metadata never nil. The error names the event.
func (r *Row) Envelope() (domain.EventEnvelope[any], error) {
	payload, err := DecodeJSON(r.Payload)
	if err != nil {
		return domain.EventEnvelope[any]{}, fmt.Errorf("event %s (type %q, position %d): decode payload: %w", r.ID, r.EventType, r.Position, err)
	}
	meta, err := DecodeJSON(r.Metadata)
	if err != nil {
		return domain.EventEnvelope[any]{}, fmt.Errorf("event %s (type %q, position %d): decode metadata: %w", r.ID, r.EventType, r.Position, err)
	}
	metadata, _ := meta.(map[string]any)
	if metadata == nil {
		metadata = map[string]any{}
	}
	return domain.EventEnvelope[any]{
		ID:            r.ID,
		AggregateID:   r.AggregateID,
		EventType:     r.EventType,
		Payload:       payload,
		Created:       r.CreatedAt.UTC(),
		SequenceNo:    r.SequenceNo,
		TransactionID: r.TransactionID,
		Metadata:      metadata,
		Position:      r.Position,
	}, nil
}

// Envelopes converts rows in order; the first row that does not decode
// fails the whole read.
func Envelopes(rows []Row) ([]domain.EventEnvelope[any], error) {
	out := make([]domain.EventEnvelope[any], len(rows))
	for i := range rows {
		env, err := rows[i].Envelope()
		if err != nil {
			return nil, err
		}
		out[i] = env
	}
	return out, nil
}

// Read runs Select followed by clause (WHERE ... ORDER BY ...) with args
// on db and decodes the rows. The caller wraps the error with what it
// was reading.
func Read(ctx context.Context, db *gorm.DB, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	var rows []Row
	if err := db.WithContext(ctx).Raw(Select+clause, args...).Scan(&rows).Error; err != nil {
		return nil, err
	}
	return Envelopes(rows)
}

// DecodeJSON decodes a stored JSON column into the value a reader sees:
// map[string]any for objects, []any, string, float64, bool or nil (an
// empty column).
func DecodeJSON(raw []byte) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v, nil
}
