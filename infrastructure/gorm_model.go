package infrastructure

import "time"

// PostgresNotifyChannel is the default channel on which GormEventStore
// NOTIFYs after every committed append on Postgres (WithNotifyChannel
// chooses another). It keeps the documented original's name:
// subscriptions.WithListenerChannel defaults to it.
const PostgresNotifyChannel = "pericarp_events"

// GormEventModel is the row layout of the events table. The table is
// created by NewGormEventStore (see the DDL in gorm_store.go; GORM's
// AutoMigrate is deliberately not used, see internal/sqlschema).
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

var eventTableObjects = struct {
	names            []string
	postgres, sqlite []string
}{
	names: []string{"events", "idx_events_transaction_id"},
	postgres: []string{
		`CREATE TABLE IF NOT EXISTS events (
			id             text        NOT NULL PRIMARY KEY,
			aggregate_id   text        NOT NULL,
			event_type     text        NOT NULL,
			sequence_no    bigint      NOT NULL,
			transaction_id text        NOT NULL DEFAULT '',
			position       bigint      NOT NULL,
			payload        jsonb,
			metadata       jsonb,
			created_at     timestamptz NOT NULL,
			CONSTRAINT events_aggregate_sequence_key UNIQUE (aggregate_id, sequence_no),
			CONSTRAINT events_position_key UNIQUE (position)
		)`,
		`CREATE INDEX IF NOT EXISTS idx_events_transaction_id ON events (transaction_id)`,
	},
	sqlite: []string{
		`CREATE TABLE IF NOT EXISTS events (
			id             text     NOT NULL PRIMARY KEY,
			aggregate_id   text     NOT NULL,
			event_type     text     NOT NULL,
			sequence_no    integer  NOT NULL,
			transaction_id text     NOT NULL DEFAULT '',
			position       integer  NOT NULL,
			payload        text,
			metadata       text,
			created_at     datetime NOT NULL,
			CONSTRAINT events_aggregate_sequence_key UNIQUE (aggregate_id, sequence_no),
			CONSTRAINT events_position_key UNIQUE (position)
		)`,
		`CREATE INDEX IF NOT EXISTS idx_events_transaction_id ON events (transaction_id)`,
	},
}
