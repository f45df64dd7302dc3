package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
)

// newAdmin returns the admin handler for sub, made as soon as the
// subscribers run so that its charts show the catch-up. Its authorizer is
// the demo's: every client on the loopback interface may do everything,
// identified by its address; an application plugs in its own
// authentication instead. It samples every second, so that the charts
// fill while you look (an application keeps the default, 15 s). The
// caller closes it, which stops its sampler.
func (ex *example) newAdmin(sub *subscriptions.Subscriber) (*admin.Handler, error) {
	return admin.NewHandler([]*subscriptions.Subscriber{sub}, loopbackOnly,
		admin.WithLogger(slog.New(slog.NewTextHandler(ex.stderr, nil))), // audit lines at INFO
		admin.WithSampleInterval(time.Second))
}

// serveAdmin serves h on -admin's address until ctx is cancelled
// (Ctrl-C), with the subscribers still running, so the page shows them
// live.
func (ex *example) serveAdmin(ctx context.Context, h *admin.Handler) error {
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	ln, err := net.Listen("tcp", ex.cfg.admin)
	if err != nil {
		return fmt.Errorf("-admin %s: %w", ex.cfg.admin, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(ex.stdout, "admin: http://%s/admin/ (replay or discard the parked event there; Ctrl-C to stop)\n", ln.Addr())
	select {
	case err := <-served:
		return fmt.Errorf("admin server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	fmt.Fprintln(ex.stdout, "admin: stopped")
	return err
}

// loopbackOnly is the example's admin.Authorizer: loopback clients may do
// everything, anyone else nothing.
func loopbackOnly(r *http.Request, _ admin.Action, _ string) (string, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsLoopback() {
		return "local " + r.RemoteAddr, true
	}
	return "", false
}
