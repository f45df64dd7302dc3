package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { VerifyTestMain(m) }

// TestCluster starts a private cluster, stops it (its port refuses
// connections, and a PgBouncer in front of it fails its clients rather
// than holding them) and starts it again with its data.
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
	query := func(dsn string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var n int
		return conn.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n)
	}
	if err := query(bouncer); err != nil {
		t.Fatalf("through PgBouncer: %v", err)
	}

	c.Stop(t)
	if err := query(pg.DSN); err == nil {
		t.Fatal("a stopped cluster answered")
	}
	started := time.Now()
	err := query(bouncer)
	if err == nil {
		t.Fatal("PgBouncer answered for a stopped cluster")
	}
	t.Logf("PgBouncer in front of the stopped cluster failed after %v: %v", time.Since(started).Round(time.Millisecond), err)

	c.Start(t)
	if err := query(pg.DSN); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := query(bouncer)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PgBouncer does not reach the started cluster: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("PgBouncer reached the started cluster %v after it started", time.Since(started).Round(time.Millisecond))
}
