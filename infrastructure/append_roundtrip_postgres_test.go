package infrastructure_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/internal/wirecount"
)

// TestPostgresLoneAppendRoundTrips checks on the wire that a lone Append
// is one round trip of two statements
// (pgfeed.RequireLoneAppendRoundTrips), through GORM's pgx pool.
func TestPostgresLoneAppendRoundTrips(t *testing.T) {
	pgfeed.RequireLoneAppendRoundTrips(t, func(t testing.TB, dsn string, wire *wirecount.Counter) domain.EventStore {
		cfg, err := pgx.ParseConfig(dsn)
		require.NoError(t, err)
		cfg.DialFunc, cfg.Tracer = wire.Dial(cfg.DialFunc), wire
		sqlDB := stdlib.OpenDB(*cfg)
		sqlDB.SetMaxOpenConns(1)
		t.Cleanup(func() { _ = sqlDB.Close() })
		db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		return newGormStore(t, db)
	})
}
