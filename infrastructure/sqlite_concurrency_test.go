package infrastructure_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestSQLiteConcurrentAppendsToOneFile appends from 8 goroutines, through
// one pool or one pool and store each, while a reader follows the feed, on
// both SQLite drivers and with every DSN style: no append fails ("database
// is locked" in particular), every event is stored, positions are dense.
// The appends of one process take turns (internal/sqlitequeue) whichever
// store they go through; without that, SQLite's busy handler let one
// writer wait out the whole busy timeout while the others proceeded (with
// github.com/glebarez/sqlite the 200 ms case failed 3 runs of 3, and the
// 5 s default once on a loaded CI machine).
func TestSQLiteConcurrentAppendsToOneFile(t *testing.T) {
	// Every DSN style an application may write, on both drivers: the
	// documented ones, and the drivers' defaults (busy timeout 5 s,
	// rollback journal, which the constructors switch to WAL, deferred
	// transactions, which the store works with because it takes the write
	// lock first in every transaction).
	original := func(path string) string { // what the original's users write
		return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	}
	plain := func(path string) string { return path }
	dsns := []struct {
		name   string
		driver dbtest.SQLiteDriver
		dsn    func(path string) string
	}{
		{"mattn/documented DSN", dbtest.Mattn, dbtest.SQLiteFileDSN},
		// Deferred transactions: the store must take the write lock first
		// itself, or a transaction that read first could not upgrade.
		{"mattn/busy timeout and WAL, deferred transactions", dbtest.Mattn, func(path string) string {
			return "file:" + path + "?_busy_timeout=10000&_journal_mode=WAL"
		}},
		{"mattn/busy timeout only (rollback journal, switched to WAL; deferred)", dbtest.Mattn, func(path string) string {
			return "file:" + path + "?_busy_timeout=10000"
		}},
		{"mattn/plain path (driver defaults, switched to WAL)", dbtest.Mattn, plain},
		{"mattn/original's _pragma DSN (ignored by this driver)", dbtest.Mattn, original},
		{"glebarez/documented DSN", dbtest.Glebarez, dbtest.Glebarez.FileDSN},
		{"glebarez/plain path (driver defaults, switched to WAL)", dbtest.Glebarez, plain},
		{"glebarez/original's _pragma DSN", dbtest.Glebarez, original},
		// A short busy timeout: far longer than one append holds the lock,
		// far shorter than all of them together.
		{"mattn/busy timeout 200 ms", dbtest.Mattn, func(path string) string {
			return "file:" + path + "?_busy_timeout=200&_journal_mode=WAL"
		}},
		{"glebarez/busy timeout 200 ms", dbtest.Glebarez, func(path string) string {
			return "file:" + path + "?_pragma=busy_timeout(200)&_pragma=journal_mode(WAL)"
		}},
	}
	const (
		writers = 8
		appends = 12
	)
	for _, d := range dsns {
		for _, poolPerWriter := range []bool{false, true} {
			name := d.name + "/shared pool"
			if poolPerWriter {
				name = d.name + "/pool per writer"
			}
			t.Run(name, func(t *testing.T) {
				ctx := testCtx(t)
				dsn := d.dsn(filepath.Join(t.TempDir(), "events.db"))
				reader := newGormStore(t, d.driver.OpenDSN(t, dsn))
				// writerStore returns writer w's store: the shared one, or one
				// constructed (concurrently, as stores starting at once would)
				// on the writer's own pool.
				dbs := make([]*gorm.DB, writers)
				for i := range dbs {
					if poolPerWriter {
						dbs[i] = d.driver.OpenDSN(t, dsn)
					}
				}
				writerStore := func(w int) (domain.EventStore, error) {
					if !poolPerWriter {
						return reader, nil
					}
					return newStoreNoCleanup(dbs[w])
				}

				errs := make(chan error, writers+1)
				stop := make(chan struct{})
				var readers, wg sync.WaitGroup
				readers.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := reader.ReadAfter(ctx, 0, 100); err != nil {
							errs <- fmt.Errorf("reader: %w", err)
							return
						}
					}
				})
				for w := range writers {
					wg.Go(func() {
						s, err := writerStore(w)
						if err != nil {
							errs <- fmt.Errorf("construct: %w", err)
							return
						}
						agg := fmt.Sprintf("w%d", w)
						for i := range appends {
							batch := []domain.EventEnvelope[any]{newEvent(agg, "x", i)}
							if i%3 == 0 {
								batch = append(batch, newEvent(agg, "y", i), newEvent(agg, "z", i))
							}
							version, err := s.GetCurrentVersion(ctx, agg)
							if err == nil {
								err = s.Append(ctx, agg, version, batch...)
							}
							if err != nil {
								errs <- fmt.Errorf("writer %d, append %d: %w", w, i, err)
								return
							}
						}
					})
				}
				wg.Wait()
				close(stop)
				readers.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}

				feed, err := reader.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				perWriter := appends + 2*((appends+2)/3)
				require.Len(t, feed, writers*perWriter)
				for i, e := range feed {
					require.Equal(t, int64(i+1), e.Position, "positions are dense")
				}
				for w := range writers {
					events, err := reader.GetEvents(ctx, fmt.Sprintf("w%d", w))
					require.NoError(t, err)
					require.Len(t, events, perWriter)
					requireStrictlyIncreasing(t, events)
				}
			})
		}
	}
}
