package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { VerifyTestMain(m) }

// TestCluster starts a private cluster, stops it (its port refuses
// connections, and a PgBouncer in front of it does not answer: it holds
// its clients' statements, up to its query_wait_timeout, or fails them)
// and starts it again with its data; the PgBouncer reaches it again.
func TestCluster(t *testing.T) {
	c := NewCluster(t)
	pg := c.NewPostgres(t)
	if err := pg.DB.Exec("CREATE TABLE kept (n int)").Error; err != nil {
		t.Fatal(err)
	}
	if err := pg.DB.Exec("INSERT INTO kept VALUES (1)").Error; err != nil {
		t.Fatal(err)
	}
	bouncer := pg.BouncerDSN(t, 2)
	query := func(dsn string, within time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var n int
		return conn.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n)
	}
	if err := query(bouncer, 20*time.Second); err != nil {
		t.Fatalf("through PgBouncer: %v", err)
	}

	c.Stop(t)
	if err := query(pg.DSN, 20*time.Second); err == nil {
		t.Fatal("a stopped cluster answered")
	}
	started := time.Now()
	err := query(bouncer, 2*time.Second)
	if err == nil {
		t.Fatal("PgBouncer answered for a stopped cluster")
	}
	t.Logf("PgBouncer in front of the stopped cluster, after %v: %v", time.Since(started).Round(time.Millisecond), err)

	c.Start(t)
	restarted := time.Now()
	if err := query(pg.DSN, 20*time.Second); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := query(bouncer, 20*time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PgBouncer does not reach the started cluster: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("PgBouncer reached the started cluster %v after it started", time.Since(restarted).Round(time.Millisecond))
}
