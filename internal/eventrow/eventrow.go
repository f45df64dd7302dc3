// Package eventrow is the GORM side of the events table's read side: it
// reads whole events through a *gorm.DB (Read) and carries a
// GormEventStore's *gorm.DB to the subscriptions package (store.go). The
// column list, the row and its decoding into the envelope readers see
// have their one home in infrastructure/pgevents, shared with pgxstore;
// the names here are that package's, for infrastructure's GormEventStore
// and the subscriptions package's Postgres read paths (the pipelined
// acquire, a partition's feed).
//
// Everything here is stateless and safe for concurrent use.
package eventrow

import (
	"context"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
)

// Columns are the columns of a whole event, in the order of Row.Targets.
const Columns = pgevents.Columns

// Select reads whole events from the events table; a caller appends its
// WHERE, ORDER BY and LIMIT.
const Select = pgevents.SelectEvents

// Row is one event as stored (pgevents.Row).
type Row = pgevents.Row

// DecodeError is a stored event that does not decode
// (pgevents.DecodeError).
type DecodeError = pgevents.DecodeError

// ReadEnvelopes decodes the rows of a Select query of at most limit rows
// and closes them (pgevents.ReadEnvelopes).
func ReadEnvelopes(rows pgx.Rows, limit int) ([]domain.EventEnvelope[any], error) {
	return pgevents.ReadEnvelopes(rows, limit)
}

// Envelopes converts rows in order (pgevents.Envelopes); the first row
// that does not decode fails the whole read.
func Envelopes(rows []Row) ([]domain.EventEnvelope[any], error) { return pgevents.Envelopes(rows) }

// SelectFrom is Select on the events table named table (a
// schema-qualified name, as schema.Qualified spells it); SelectFrom("events")
// is Select.
func SelectFrom(table string) string { return "SELECT " + Columns + " FROM " + table + " " }

// Read runs Select followed by clause (WHERE ... ORDER BY ...) with args
// on db and decodes the rows. The caller wraps the error with what it
// was reading.
func Read(ctx context.Context, db *gorm.DB, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	return ReadFrom(ctx, db, "events", clause, args...)
}

// ReadFrom is Read on the events table named table (see SelectFrom).
func ReadFrom(ctx context.Context, db *gorm.DB, table, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	var rows []Row
	if err := db.WithContext(ctx).Raw(SelectFrom(table)+clause, args...).Scan(&rows).Error; err != nil {
		return nil, err
	}
	return Envelopes(rows)
}
