package migrations

import (
	"context"

	"gorm.io/gorm"
)

// verifyOnlyKey marks a *gorm.DB given to VerifyOnly.
const verifyOnlyKey = "eventfeed/subscriptions:schema-verify-only"

// VerifyOnly returns db marked so that every constructor of this module
// given it (infrastructure.NewGormEventStore, subscriptions.NewGormCheckpointStore
// and subscriptions.NewGormParkingLot) runs no DDL and only checks the
// schema (Verify), as each one's WithSchemaVerifyOnly option does: the
// choice is made once, where the handle is opened, for an application
// whose schema a migration tool manages:
//
//	db = migrations.VerifyOnly(db)
//
// The returned handle is db's configuration and pool; db itself is not
// changed. It is safe for concurrent use, as db is.
func VerifyOnly(db *gorm.DB) *gorm.DB { return db.Set(verifyOnlyKey, true) }

// Ensure prepares db's schema for a constructor of this module: it applies
// the missing migrations (Migrate), or, with verifyOnly or on a handle
// marked by VerifyOnly, only checks that none is missing (Verify).
func Ensure(ctx context.Context, db *gorm.DB, verifyOnly bool) error {
	return EnsureSchema(ctx, db, "", verifyOnly)
}

// EnsureSchema is Ensure for a constructor given a Postgres schema of its
// own (subscriptions.WithSchema): MigrateSchema or VerifySchema of name,
// or Ensure itself when name is "" (the schema db's search_path selects).
func EnsureSchema(ctx context.Context, db *gorm.DB, name string, verifyOnly bool) error {
	if marked, ok := db.Get(verifyOnlyKey); ok && marked == true {
		verifyOnly = true
	}
	switch {
	case name == "" && verifyOnly:
		return Verify(ctx, db)
	case name == "":
		return Migrate(ctx, db)
	case verifyOnly:
		return VerifySchema(ctx, db, name)
	}
	return MigrateSchema(ctx, db, name)
}
