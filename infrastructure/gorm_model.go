package infrastructure

import (
	"time"

	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
)

// PostgresNotifyChannel is the default channel on which GormEventStore
// NOTIFYs after every committed append on Postgres (WithNotifyChannel
// chooses another). It keeps the documented original's name:
// subscriptions.WithListenerChannel defaults to it. It is
// pgevents.DefaultNotifyChannel, pgxstore's default too.
const PostgresNotifyChannel = pgevents.DefaultNotifyChannel

// MaxIdentifierBytes bounds event IDs, aggregate IDs, event types and
// transaction IDs in every store of this package (and pgxstore's).
// Longer values are rejected with domain.ErrInvalidEvent rather than
// truncated, and the bound keeps every identifier inside what a Postgres
// B-tree index entry can hold. It is pgevents.MaxIdentifierBytes.
const MaxIdentifierBytes = pgevents.MaxIdentifierBytes

// GormEventModel is the row layout of the events table. The table is
// created by the module's migrations (package migrations, applied by
// NewGormEventStore), not by GORM's AutoMigrate.
type GormEventModel struct {
	ID            string    `gorm:"column:id;primaryKey"`
	AggregateID   string    `gorm:"column:aggregate_id;not null;uniqueIndex:events_aggregate_sequence_key"`
	EventType     string    `gorm:"column:event_type;not null"`
	SequenceNo    int       `gorm:"column:sequence_no;not null;uniqueIndex:events_aggregate_sequence_key"`
	TransactionID string    `gorm:"column:transaction_id;not null;default:'';index:idx_events_transaction_id"`
	Position      int64     `gorm:"column:position;not null;uniqueIndex:events_position_key"`
	Payload       []byte    `gorm:"column:payload;type:jsonb"`
	Metadata      []byte    `gorm:"column:metadata;type:jsonb"`
	CreatedAt     time.Time `gorm:"column:created_at;not null"`
}

// TableName returns "events".
func (GormEventModel) TableName() string { return "events" }

// The feed's reads scan into pgevents.Row, which must keep this model's
// fields: the conversion stops compiling when the two drift.
var _ = pgevents.Row(GormEventModel{})
