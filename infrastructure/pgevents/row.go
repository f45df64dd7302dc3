package pgevents

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/domain"
)

// Columns are the columns of a whole event, in the order of Row.Targets.
const Columns = "id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at"

// SelectEvents reads whole events from the search_path's events table
// (Table.SelectEvents reads another); a caller appends its WHERE, ORDER
// BY and LIMIT.
const SelectEvents = "SELECT " + Columns + " FROM events "

const selectEventsTemplate = "SELECT " + Columns + " FROM {{events}} "

// PartitionHash is subscriptions.PartitionOf's hash as an SQL expression
// on aggregate_id: the first eight hex digits of md5(aggregate_id) as an
// unsigned 32-bit integer (a bigint, so that a modulo stays
// non-negative), so that every Postgres store reads a partition's events
// as PartitionOf assigns them.
const PartitionHash = `('x' || substr(md5(aggregate_id), 1, 8))::bit(32)::bigint`

// PositionsArray is the bigint[] literal of positions ("{1,2,3}"), to
// select the rows at positions with one parameter whatever their number
// (position = ANY($1::bigint[])): one statement text for a driver's
// statement cache. It is safe for concurrent use.
func PositionsArray(positions []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range positions {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(p, 10))
	}
	b.WriteByte('}')
	return b.String()
}

// Row is one event as stored, the one decoding of the events table's rows
// into envelopes for every reader (both stores, and the subscriptions
// package's pipelined reads), so that they all return the same values.
// Its fields are those of infrastructure.GormEventModel, the table's
// documented model; the gorm tags (mere strings: nothing here imports
// GORM) let GORM scan into it under any naming strategy. A Row is a plain
// value, not safe for concurrent writes.
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
// scan (pgx).
func (r *Row) Targets() []any {
	return []any{&r.ID, &r.AggregateID, &r.EventType, &r.SequenceNo, &r.TransactionID, &r.Position, &r.Payload, &r.Metadata, &r.CreatedAt}
}

// DecodeError is Row.Envelope's failure: a stored event whose payload or
// metadata does not decode (valid jsonb that encoding/json cannot hold,
// such as a number beyond float64). A reader tells it from a failure to
// read with errors.As.
type DecodeError struct {
	ID, EventType string
	Position      int64
	Column        string // "payload" or "metadata"
	Err           error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("event %s (type %q, position %d): decode %s: %v", e.ID, e.EventType, e.Position, e.Column, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Envelope converts the row into the envelope readers see: payload and
// metadata decoded from JSON (objects as map[string]any, numbers as
// float64), Created in UTC, Metadata never nil. The error, a
// *DecodeError, names the event.
func (r *Row) Envelope() (domain.EventEnvelope[any], error) {
	payload, err := decodeJSON(r.Payload)
	if err != nil {
		return domain.EventEnvelope[any]{}, &DecodeError{ID: r.ID, EventType: r.EventType, Position: r.Position, Column: "payload", Err: err}
	}
	meta, err := decodeJSON(r.Metadata)
	if err != nil {
		return domain.EventEnvelope[any]{}, &DecodeError{ID: r.ID, EventType: r.EventType, Position: r.Position, Column: "metadata", Err: err}
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
// fails the whole read. It is safe for concurrent use on rows nobody
// writes.
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

// ScanEnvelopes decodes the rows of a SelectEvents query and closes them;
// the first row that does not scan or decode fails the whole read (a
// *DecodeError for one that does not decode). An empty result is an
// empty, non-nil slice.
func ScanEnvelopes(rows pgx.Rows) ([]domain.EventEnvelope[any], error) {
	return ReadEnvelopes(rows, 0)
}

// ReadEnvelopes is ScanEnvelopes for a read of at most limit rows (its
// LIMIT; 0 for none), which only sizes the result: the slice starts
// small, as a wake-up's read brings a few events, and doubles up to
// limit, so that a full batch allocates about twice its envelopes and its
// last slice exactly; an empty read allocates none. The rows are scanned
// into one Row and scan targets reused from row to row, the JSON columns
// copied into buffers reused too (they are decoded, never kept): a read
// allocates only what its envelopes hold.
func ReadEnvelopes(rows pgx.Rows, limit int) ([]domain.EventEnvelope[any], error) {
	defer rows.Close()
	out := []domain.EventEnvelope[any]{}
	var s rowScanner
	for rows.Next() {
		if err := s.scan(rows); err != nil {
			return nil, err
		}
		env, err := s.row.Envelope()
		if err != nil {
			return nil, err
		}
		if len(out) == cap(out) {
			grown := max(2*cap(out), 16)
			if limit > len(out) && grown > limit {
				grown = limit
			}
			out = append(make([]domain.EventEnvelope[any], 0, grown), out...)
		}
		out = append(out, env)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// rowScanner scans the rows of a SelectEvents query one at a time into
// one Row and scan targets it reuses, the JSON columns into buffers it
// reuses (see ReadEnvelopes). It is not safe for concurrent use.
type rowScanner struct {
	row               Row
	payload, metadata reusedBytes
	targets           []any
}

// scan scans rows' current row (after rows.Next) into s.row, whose JSON
// columns stay valid until the next scan.
func (s *rowScanner) scan(rows pgx.Rows) error {
	if s.targets == nil {
		r := &s.row
		s.targets = []any{&r.ID, &r.AggregateID, &r.EventType, &r.SequenceNo, &r.TransactionID, &r.Position, &s.payload, &s.metadata, &r.CreatedAt}
	}
	if err := rows.Scan(s.targets...); err != nil {
		return err
	}
	s.row.Payload, s.row.Metadata = s.payload, s.metadata
	return nil
}

// reusedBytes is a JSON column's scan target (pgtype.BytesScanner): pgx
// hands it the column's bytes, which it copies into its own buffer, kept
// from row to row, where a []byte target would get a fresh copy per row.
// A NULL column leaves it empty, as it leaves a []byte nil.
type reusedBytes []byte

// ScanBytes implements pgtype.BytesScanner.
func (b *reusedBytes) ScanBytes(v []byte) error {
	*b = append((*b)[:0], v...)
	return nil
}

// decodeJSON decodes a stored JSON column into the value a reader sees:
// map[string]any for objects, []any, string, float64, bool or nil (an
// empty column).
func decodeJSON(raw []byte) (any, error) {
	switch {
	case len(raw) == 0:
		return nil, nil
	case string(raw) == "{}":
		// The metadata of most events: what json.Unmarshal would return,
		// without its two passes over the input and its decoder state.
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v, nil
}
