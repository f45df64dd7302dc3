package dbtest

import (
	"testing"
	"time"

	"gorm.io/gorm"
)

// The original module's models, copied from its documentation
// (shared/spec/subscriptions-api.md, GormCheckpointModel and
// GormParkedEventModel): the tables it creates with GORM AutoMigrate. The
// one copy for every test that needs the original's schema or writes rows
// as the original does. (Its event model's tags are not
// documented; these give the documented columns, keys and indexes the
// names GORM would.)
type (
	// OriginalCheckpoint is the original's GormCheckpointModel.
	OriginalCheckpoint struct {
		Subscriber string    `gorm:"primaryKey;column:subscriber"`
		Position   int64     `gorm:"column:position;not null"`
		UpdatedAt  time.Time `gorm:"column:updated_at"`
	}
	// OriginalParkedEvent is the original's GormParkedEventModel.
	OriginalParkedEvent struct {
		Subscriber string    `gorm:"primaryKey;column:subscriber"`
		EventID    string    `gorm:"primaryKey;column:event_id"`
		EventType  string    `gorm:"column:event_type"`
		Position   int64     `gorm:"column:position"`
		Error      string    `gorm:"column:error"`
		Attempts   int       `gorm:"column:attempts"`
		ParkedAt   time.Time `gorm:"column:parked_at"`
	}
	// OriginalEvent is the original's events table.
	OriginalEvent struct {
		ID            string    `gorm:"primaryKey;column:id"`
		AggregateID   string    `gorm:"column:aggregate_id;not null;uniqueIndex:idx_aggregate_sequence,priority:1"`
		EventType     string    `gorm:"column:event_type;not null"`
		SequenceNo    int       `gorm:"column:sequence_no;not null;uniqueIndex:idx_aggregate_sequence,priority:2"`
		TransactionID string    `gorm:"column:transaction_id;index"`
		Position      int64     `gorm:"column:position;not null;uniqueIndex"`
		Payload       []byte    `gorm:"column:payload;type:jsonb"`
		Metadata      []byte    `gorm:"column:metadata;type:jsonb"`
		CreatedAt     time.Time `gorm:"column:created_at"`
	}
)

func (OriginalCheckpoint) TableName() string  { return "subscriber_checkpoints" }
func (OriginalParkedEvent) TableName() string { return "parked_events" }
func (OriginalEvent) TableName() string       { return "events" }

// OriginalRows is what CreateOriginalSchema stored: the events in feed
// order, one subscriber's checkpoint (after the third event) and one
// parked event of that subscriber (the second).
type OriginalRows struct {
	EventIDs   []string
	Subscriber string
	Checkpoint int64
	ParkedID   string
}

// CreateOriginalSchema creates in db the tables the original module
// creates (GORM AutoMigrate of its models; on Postgres also its position
// sequence and xact_id column). With rows, it fills them as the original
// writes them: five events, a checkpoint and a parked event.
func CreateOriginalSchema(t testing.TB, db *gorm.DB, rows bool) OriginalRows {
	t.Helper()
	if err := db.AutoMigrate(&OriginalEvent{}, &OriginalCheckpoint{}, &OriginalParkedEvent{}); err != nil {
		t.Fatalf("dbtest: original schema: %v", err)
	}
	if db.Name() == "postgres" {
		for _, stmt := range []string{
			"CREATE SEQUENCE IF NOT EXISTS events_position_seq",
			"ALTER TABLE events ALTER COLUMN position SET DEFAULT nextval('events_position_seq')",
			"ALTER TABLE events ADD COLUMN IF NOT EXISTS xact_id xid8 NOT NULL DEFAULT pg_current_xact_id()",
		} {
			if err := db.Exec(stmt).Error; err != nil {
				t.Fatalf("dbtest: original schema: %s: %v", stmt, err)
			}
		}
	}
	if !rows {
		return OriginalRows{}
	}
	out := OriginalRows{Subscriber: "original-subscriber", Checkpoint: 3}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := 1; i <= 5; i++ {
		ev := OriginalEvent{
			ID: "original-event-" + string(rune('0'+i)), AggregateID: "original-agg", EventType: "original.happened",
			SequenceNo: i, TransactionID: "original-tx", Position: int64(i),
			Payload: []byte(`{"n":` + string(rune('0'+i)) + `}`), Metadata: []byte(`{}`), CreatedAt: created,
		}
		if err := db.Create(&ev).Error; err != nil {
			t.Fatalf("dbtest: original event: %v", err)
		}
		out.EventIDs = append(out.EventIDs, ev.ID)
	}
	if err := db.Create(&OriginalCheckpoint{Subscriber: out.Subscriber, Position: out.Checkpoint, UpdatedAt: created}).Error; err != nil {
		t.Fatalf("dbtest: original checkpoint: %v", err)
	}
	out.ParkedID = out.EventIDs[1]
	if err := db.Create(&OriginalParkedEvent{Subscriber: out.Subscriber, EventID: out.ParkedID, EventType: "original.happened",
		Position: 2, Error: "original failure", Attempts: 6, ParkedAt: created}).Error; err != nil {
		t.Fatalf("dbtest: original parked event: %v", err)
	}
	return out
}
