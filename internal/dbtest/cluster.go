package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClusterBinEnv names a directory holding initdb and postgres, for
// NewCluster; unset, PATH and then /usr/lib/postgresql/<version>/bin
// (the newest first) are searched.
const ClusterBinEnv = "SUBSCRIPTIONS_POSTGRES_BIN"

// clusterConf is appended to every private cluster's postgresql.conf:
// loopback TCP only (no socket to collide with the shared server's), no
// durability (the cluster is thrown away), little memory and few
// connections, since several tests' clusters share the machine.
const clusterConf = `
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = minimal
max_wal_senders = 0
max_connections = 40
shared_buffers = 16MB
log_min_messages = warning
`

// Cluster is a Postgres server of one test's own, on a port of its own:
// for tests that stop and start a server, or spread tenants over several.
// It runs as a child of the test process (with a parent-death signal, so a
// test binary killed by its timeout leaves no server behind), as the
// postgres OS user when the test runs as root (Postgres refuses root), in
// a temporary directory removed at cleanup, with trust authentication for
// user postgres, fsync off and max_connections 40. Its methods are safe
// for concurrent use.
type Cluster struct {
	bin  string
	dir  string // the data directory
	port int
	cred *syscall.Credential

	mu      sync.Mutex
	proc    *exec.Cmd
	exited  chan struct{} // closed once proc has been reaped
	log     lockedBuffer  // every run's server output
	removed bool
}

// NewCluster starts a private Postgres cluster for the test and stops and
// removes it at cleanup. The data directory is a copy of one initdb'ed
// template per test binary (when the package's TestMain is
// VerifyTestMain, which removes it at exit; else one initdb per cluster).
// Without the Postgres server binaries the test is skipped, or fails when
// SUBSCRIPTIONS_REQUIRE_POSTGRES=1.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := clusterBin(t)
	cred := clusterCredential(t)
	root, err := os.MkdirTemp("", "dbtest-cluster-")
	if err != nil {
		t.Fatalf("dbtest: cluster: %v", err)
	}
	c := &Cluster{bin: bin, dir: filepath.Join(root, "data"), cred: cred}
	t.Cleanup(func() {
		c.mu.Lock()
		c.removed = true
		c.mu.Unlock()
		c.halt(syscall.SIGQUIT) // immediate shutdown: nothing to keep
		if t.Failed() {
			t.Logf("CLUSTER LOG (port %d):\n%s", c.port, c.log.String())
		}
		_ = os.RemoveAll(root)
	})
	if err := c.chown(root); err != nil {
		t.Fatalf("dbtest: cluster: %v", err)
	}
	if err := c.initData(); err != nil {
		t.Fatalf("dbtest: cluster: %v", err)
	}
	// The port is free when chosen but may be taken before the server
	// binds it: another one then.
	for attempt := 1; ; attempt++ {
		c.port = freeLoopbackPort(t)
		err := c.start()
		if err == nil {
			return c
		}
		if attempt == 3 {
			t.Fatalf("dbtest: cluster: %v\n%s", err, c.log.String())
		}
	}
}

// DSN is the cluster's database postgres, as user postgres.
func (c *Cluster) DSN() string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: "127.0.0.1:" + strconv.Itoa(c.port), Path: "/postgres",
		RawQuery: url.Values{"sslmode": {"disable"}}.Encode()}
	return u.String()
}

// Port is the loopback port the cluster listens on, whether it runs or not.
func (c *Cluster) Port() int { return c.port }

// Stop stops the server with a fast shutdown (sessions are terminated,
// transactions in flight roll back) and returns once it has exited: its
// port then refuses connections. Stopping a stopped cluster does nothing.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if !c.halt(syscall.SIGINT) {
		t.Fatalf("dbtest: cluster on port %d did not stop within 30s:\n%s", c.port, c.log.String())
	}
}

// Start starts the stopped server again on the same port and data, and
// returns once it accepts connections. Starting a running cluster does
// nothing.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	if err := c.start(); err != nil {
		t.Fatalf("dbtest: cluster: %v\n%s", err, c.log.String())
	}
}

// NewPostgres creates a fresh schema on the cluster, as dbtest.NewPostgres
// does on the test server: its DSN selects it, DB is a pool on it closed
// at cleanup, and BouncerDSN puts a PgBouncer in front of it. The schema
// is not dropped (the cluster is removed at cleanup).
func (c *Cluster) NewPostgres(t testing.TB) *Postgres {
	t.Helper()
	schema := "t_" + randomHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatalf("dbtest: cluster: connect: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("dbtest: cluster: create schema %s: %v", schema, err)
	}
	dsn, err := WithSearchPath(c.DSN(), schema)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	pg := &Postgres{Schema: schema, DSN: dsn, server: c.DSN()}
	pg.DB = pg.Open(t)
	return pg
}

// start runs the postmaster unless it runs, and waits until it accepts
// connections.
func (c *Cluster) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return fmt.Errorf("cluster on port %d: started after its cleanup", c.port)
	}
	if c.proc != nil {
		return nil
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", c.dir, "-p", strconv.Itoa(c.port))
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = &c.log, &c.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	c.proc, c.exited = cmd, exited
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.DSN())
		if err == nil {
			_ = conn.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-exited:
			c.proc, c.exited = nil, nil
			return fmt.Errorf("postgres on port %d exited at startup", c.port)
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			c.proc, c.exited = nil, nil
			return fmt.Errorf("postgres on port %d does not accept connections within 60s: %v", c.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// halt sends sig to the postmaster and waits (30s, then SIGKILL) for it
// to exit; false if it had to be killed. Its backends end with it.
func (c *Cluster) halt(sig syscall.Signal) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return true
	}
	proc, exited := c.proc, c.exited
	c.proc, c.exited = nil, nil
	_ = proc.Process.Signal(sig)
	select {
	case <-exited:
		return true
	case <-time.After(30 * time.Second):
		_ = proc.Process.Kill()
		<-exited
		return false
	}
}

// initData fills the data directory: a copy of the template, or an
// initdb of its own when templates are not cached.
func (c *Cluster) initData() error {
	template, err := clusterTemplate(c)
	if err != nil {
		return err
	}
	if template == "" {
		return c.initdb(c.dir)
	}
	// cp -a keeps the owner (postgres) when run as root, the caller
	// otherwise: either way the server's account.
	if out, err := exec.Command("cp", "-a", template, c.dir).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the template data directory: %w: %s", err, out)
	}
	return nil
}

// initdb creates a data directory at dir with clusterConf.
func (c *Cluster) initdb(dir string) error {
	cmd := exec.Command(filepath.Join(c.bin, "initdb"), "-D", dir, "-U", "postgres", "--auth=trust", "--no-sync",
		"--encoding=UTF8", "--no-locale")
	cmd.Dir = filepath.Dir(dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	conf, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = conf.WriteString(clusterConf)
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	return err
}

// chown gives dir to the server's account (when the test runs as root).
func (c *Cluster) chown(dir string) error {
	if c.cred == nil {
		return nil
	}
	return os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid))
}

// clusterTemplates is the initdb'ed data directory NewCluster copies, one
// per test binary; enabled by VerifyTestMain, which removes it at exit.
var clusterTemplates struct {
	mu      sync.Mutex
	enabled bool
	root    string
	dir     string
}

// clusterTemplate returns the template data directory, creating it on
// first use; "" when templates are not cached.
func clusterTemplate(c *Cluster) (string, error) {
	ct := &clusterTemplates
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if !ct.enabled {
		return "", nil
	}
	if ct.dir != "" {
		return ct.dir, nil
	}
	root, err := os.MkdirTemp("", "dbtest-cluster-template-")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "data")
	if err := c.chown(root); err != nil {
		_ = os.RemoveAll(root)
		return "", err
	}
	if err := c.initdb(dir); err != nil {
		_ = os.RemoveAll(root)
		return "", err
	}
	ct.root, ct.dir = root, dir
	return dir, nil
}

// removeClusterTemplate removes the template, at the test binary's exit.
func removeClusterTemplate() {
	ct := &clusterTemplates
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if ct.root != "" {
		_ = os.RemoveAll(ct.root)
	}
	ct.enabled, ct.root, ct.dir = false, "", ""
}

// clusterBin finds the directory of initdb and postgres, or skips (fails,
// when Postgres is required) the test.
func clusterBin(t testing.TB) string {
	t.Helper()
	var candidates []string
	if dir := os.Getenv(ClusterBinEnv); dir != "" {
		candidates = append(candidates, dir)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		candidates = append(candidates, filepath.Dir(p))
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(dirs) > 0 {
		// Newest first: numeric versions sorted descending.
		for v := 30; v >= 10; v-- {
			for _, d := range dirs {
				if filepath.Base(filepath.Dir(d)) == strconv.Itoa(v) {
					candidates = append(candidates, d)
				}
			}
		}
	}
	for _, dir := range candidates {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir
		}
	}
	msg := fmt.Sprintf("dbtest: no Postgres server binaries (initdb, postgres) in $%s, PATH or /usr/lib/postgresql/*/bin", ClusterBinEnv)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s; %s=1 requires them", msg, RequireEnv)
	}
	t.Skip(msg)
	return ""
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// clusterCredential is the account the server runs as: postgres when the
// test runs as root (Postgres refuses to), nil (the test's own) otherwise.
func clusterCredential(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		msg := "dbtest: the test runs as root and there is no postgres OS user to run Postgres and PgBouncer as"
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s: %v", msg, err)
		}
		t.Skip(msg)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}
