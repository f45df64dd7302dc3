package dbtest

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BouncerEnv, set to 1, turns "no pgbouncer binary" into a test failure
// (SUBSCRIPTIONS_REQUIRE_POSTGRES=1 does too): CI installs PgBouncer.
const BouncerEnv = "SUBSCRIPTIONS_REQUIRE_PGBOUNCER"

// BouncerDSN starts a PgBouncer of the test's own in transaction pooling
// mode in front of the test server, serving the test's schema as database
// "bouncer" (PgBouncer 1.18 does not pass a client's search_path on, so
// the schema is set on each server connection it opens: connect_query),
// with at most serverConns server connections, and returns a DSN through
// it; it is stopped at cleanup. The DSN selects pgx's exec query mode:
// PgBouncer before 1.21 cannot keep named prepared statements in
// transaction mode (docs/operations.md, "PgBouncer"). Without a
// pgbouncer binary the test is skipped, or fails when CI requires it.
func (p *Postgres) BouncerDSN(t testing.TB, serverConns int) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, serr := os.Stat(bin); serr != nil {
			msg := "pgbouncer not installed (apt-get install pgbouncer)"
			if os.Getenv(BouncerEnv) == "1" || os.Getenv(RequireEnv) == "1" {
				t.Fatalf("dbtest: %s; CI requires it", msg)
			}
			t.Skip(msg)
		}
	}
	server, err := url.Parse(PostgresDSN())
	if err != nil {
		t.Fatalf("dbtest: parse %s: %v", DSNEnv, err)
	}
	host, port := server.Hostname(), server.Port()
	if port == "" {
		port = "5432"
	}
	serverUser := server.User.Username()
	dbname := strings.TrimPrefix(server.Path, "/")
	listen := freeLoopbackPort(t)
	dir := t.TempDir()
	ini := fmt.Sprintf(`[databases]
bouncer = host=%s port=%s dbname=%s user=%s connect_query='SET search_path = %s'
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,search_path
`, host, port, dbname, serverUser, p.Schema, listen, serverConns)
	path := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o644); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	args := []string{path}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root: it drops to the server's
		// account, which must read the file.
		args = []string{"-u", "postgres", path}
		if u, err := user.Lookup("postgres"); err == nil {
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			_ = os.Chown(dir, uid, gid)
			_ = os.Chown(path, uid, gid)
		}
	}
	cmd := exec.Command(bin, args...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("dbtest: start pgbouncer: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("PGBOUNCER LOG:\n%s", out.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("dbtest: pgbouncer exited (%v): %s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dbtest: pgbouncer does not listen on %s: %s", addr, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	dsn := url.URL{Scheme: "postgres", User: url.User(serverUser), Host: addr, Path: "/bouncer",
		RawQuery: url.Values{"sslmode": {"disable"}, "default_query_exec_mode": {"exec"}}.Encode()}
	return dsn.String()
}

// freeLoopbackPort returns a loopback TCP port nothing listens on now.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// lockedBuffer is a bytes.Buffer a child process writes to while a test
// reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
