// Package admin is the operator surface of package subscriptions: an
// http.Handler (NewHandler) with a JSON API and one server-rendered page
// over the public API of a set of Subscribers (NewHandler) or of a
// Group's tenants (NewGroupHandler), behind the application's
// own authorization.
package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/eventfeed/subscriptions"
)

// Action names what an admin request wants to do, for the Authorizer
// to decide on.
type Action string

// The actions of the admin handler. Read covers every GET (status,
// parked events, one event with its payload); the others change state.
// Pause and Resume act on the subscriber's name everywhere (every
// replica, partition and process: Subscriber.Pause), not only on this
// process.
const (
	Read    Action = "read"
	Replay  Action = "replay"
	Discard Action = "discard"
	Reset   Action = "reset"
	Pause   Action = "pause"
	Resume  Action = "resume"
)

// Authorizer is the application's own authorization, asked before
// every admin request: it returns the caller's identity (logged with every
// action) and whether the caller may perform action on subscriber (""
// when the request is about every subscriber: the API's list). An empty
// caller with allowed false is answered 401, a known caller not allowed
// 403. The page also asks it Read for each subscriber it would show, and
// shows only those allowed (see NewHandler). It is called on the
// request's goroutine, possibly several times per request, and must be
// safe for concurrent use.
type Authorizer func(r *http.Request, action Action, subscriber string) (caller string, allowed bool)

// Option configures NewHandler.
type Option func(*config)

type config struct {
	logger      *slog.Logger
	redact      bool
	origins     []string
	sampleEvery time.Duration
	clock       clock
}

// WithLogger sets the logger of the admin handler's audit lines
// (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithRedactedPayloads hides event payloads and metadata from the
// API and the page (they may hold personal data); types, positions,
// aggregate IDs and errors are still shown.
func WithRedactedPayloads() Option {
	return func(c *config) { c.redact = true }
}

// WithTrustedOrigins lists origins (scheme://host[:port]) besides the
// request's own host from which state-changing requests are accepted —
// for a handler behind a proxy that rewrites Host.
func WithTrustedOrigins(origins ...string) Option {
	return func(c *config) { c.origins = append(c.origins, origins...) }
}

// Handler is the admin handler: an http.Handler serving the admin API and
// page over a fixed set of subscribers (see NewHandler) or the tenants of
// a group (NewGroupHandler), and the owner of
// the goroutine that samples them for the page's charts (see Close). It
// is safe for concurrent use: its fields are set by NewHandler and then
// only read, except replayMu, a sync.Map of per-subscriber locks, and
// history, which has a mutex of its own.
type Handler struct {
	src      source // the rows: NewHandler's subscribers, or a group's tenants
	auth     TenantAuthorizer
	cfg      config
	origins  map[string]bool
	csrfKey  []byte
	mux      *http.ServeMux
	page     *template.Template
	replayMu sync.Map // key -> *sync.Mutex, held by a replay
	history  *history // the samples the charts are drawn from
	sampler  *sampler // the goroutine taking them
}

// NewHandler returns the admin handler for operators: a JSON API under
// api/ and, at its root, an HTML page (server-rendered, no external
// assets, works without JavaScript) to see each subscriber's position,
// lag and parked events (a partitioned subscriber's partitions on a
// click, and without one when a partition is failing or stuck), look at a
// parked event, replay or discard it, reset a checkpoint, and pause or
// resume a subscriber everywhere. Beside each subscriber's lag (in events
// and in time) and throughput (events handled per minute) the page draws
// the last hour of them as small charts (inline SVG, rendered on the
// server) from samples the handler takes itself: NewHandler starts a
// goroutine that reads every subscriber's Status at once and then every
// WithSampleInterval (15 s by default), keeping an hour in memory, until
// Close, which the caller must call when it no longer serves the handler. The handler reads the subscribers
// through package subscriptions' public API only. Mount it under any
// prefix with the standard ServeMux:
//
//	mux.Handle("/admin/subscriptions/", http.StripPrefix("/admin/subscriptions", h))
//
// Security is not optional. authorize is required and asked before every
// request; every action is logged with the caller it returns (and every
// refusal too). What a caller may read is decided per subscriber: the
// page lists only the subscribers on which authorize allows Read — on
// every render, including the one after a failed replay or discard — so
// an operator who may read some subscribers gets a page of those (the
// page is refused only to a caller who may read none), while the API's
// list, GET api/subscribers, is about every subscriber, asks about "" and
// is answered 403 unless that is allowed (such a caller reads
// api/subscribers/{name} instead). State-changing requests are POST or
// DELETE only, refuse cross-site requests (Sec-Fetch-Site, and Origin or
// Referer must match the request's host or WithTrustedOrigins), and must
// carry either a JSON content type (API) or the page's anti-CSRF token
// (forms). The token is derived from the caller identity with a key drawn
// per handler, so a form is only accepted by the handler (process) that
// rendered it. docs/admin.md lists the routes and their status
// codes.
//
// The handler is safe for concurrent use; requests run on the server's
// goroutines, and replays on the request's (at most one replay per
// subscriber at a time: another is answered 409); the sampler runs on its
// own goroutine, one Status call at a time. It returns an error for a nil
// authorizer, no subscribers, two subscribers with one name, or an
// option out of its range.
func NewHandler(subscribers []*subscriptions.Subscriber, authorize Authorizer, opts ...Option) (*Handler, error) {
	if authorize == nil {
		return nil, errors.New("admin: NewHandler: authorize: nil authorizer (the handler never serves without one)")
	}
	if len(subscribers) == 0 {
		return nil, errors.New("admin: NewHandler: subscribers: none given")
	}
	src := fixedSource{subs: map[string]*subscriptions.Subscriber{}}
	for i, s := range subscribers {
		if s == nil {
			return nil, fmt.Errorf("admin: NewHandler: subscribers[%d] is nil", i)
		}
		if _, dup := src.subs[s.Name()]; dup {
			return nil, fmt.Errorf("admin: NewHandler: subscribers: two named %q (give one Subscriber per name)", s.Name())
		}
		src.subs[s.Name()] = s
		src.names = append(src.names, s.Name())
	}
	sort.Strings(src.names)
	auth := func(r *http.Request, action Action, _, subscriber string) (string, bool) {
		return authorize(r, action, subscriber)
	}
	return newHandler("NewHandler", src, auth, opts)
}

// newHandler is NewHandler's and NewGroupHandler's: the handler over src,
// its options checked (errors name constructor).
func newHandler(constructor string, src source, authorize TenantAuthorizer, opts []Option) (*Handler, error) {
	h := &Handler{src: src, auth: authorize, origins: map[string]bool{}}
	for _, opt := range opts {
		if opt != nil {
			opt(&h.cfg)
		}
	}
	if h.cfg.logger == nil {
		h.cfg.logger = slog.Default()
	}
	for _, o := range h.cfg.origins {
		u, err := url.Parse(o)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("admin: %s: WithTrustedOrigins: %q is not scheme://host[:port]", constructor, o)
		}
		h.origins[strings.ToLower(u.Scheme+"://"+u.Host)] = true
	}
	h.csrfKey = make([]byte, 32)
	if _, err := rand.Read(h.csrfKey); err != nil {
		return nil, fmt.Errorf("admin: %s: draw the anti-CSRF key: %w", constructor, err)
	}
	if err := h.cfg.validateSampling(); err != nil {
		return nil, fmt.Errorf("admin: %s: %w", constructor, err)
	}
	var err error
	if h.page, err = parsePage(); err != nil {
		return nil, fmt.Errorf("admin: %s: page template: %w", constructor, err)
	}
	h.routes()
	h.history = newHistory(h.cfg.sampleEvery)
	h.startSampler() // last: no error return after it, which would leak it
	return h, nil
}

// ServeHTTP serves one admin request (see NewHandler), on the caller's
// goroutine; safe for concurrent use.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

// refusal is a request refused before it reached its action.
type refusal struct {
	status int
	reason string
}

// authorize asks the application about k (name "": a list), logs a
// refusal and returns the caller.
func (h *Handler) authorize(r *http.Request, action Action, k key) (string, *refusal) {
	caller, ok := h.auth(r, action, k.tenant, k.name)
	if ok {
		return caller, nil
	}
	ref := &refusal{status: http.StatusForbidden, reason: "not allowed"}
	if caller == "" {
		ref = &refusal{status: http.StatusUnauthorized, reason: "not authenticated"}
	}
	h.logRefusal(r, caller, action, k, ref)
	return caller, ref
}

// logRefusal logs a request refused before its action, naming k.
func (h *Handler) logRefusal(r *http.Request, caller string, action Action, k key, ref *refusal) {
	attrs := append([]any{"reason", ref.reason, "action", string(action), "caller", caller}, k.logAttrs()...)
	h.cfg.logger.Warn("admin request refused", append(attrs, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)...)
}

// sameOrigin refuses a state-changing request sent by another site: a
// browser marks it with Sec-Fetch-Site and always sends Origin (or at
// least Referer) on a cross-origin POST or DELETE. Requests without
// either header come from non-browser clients, which CSRF cannot drive.
func (h *Handler) sameOrigin(r *http.Request) *refusal {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return &refusal{http.StatusForbidden, "cross-site request (Sec-Fetch-Site: " + site + ")"}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		if ref := r.Header.Get("Referer"); ref != "" {
			if u, err := url.Parse(ref); err == nil {
				origin = u.Scheme + "://" + u.Host
			} else {
				origin = "null"
			}
		}
	}
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return &refusal{http.StatusForbidden, "cross-origin request (Origin " + origin + ")"}
	}
	if strings.EqualFold(u.Host, r.Host) || h.origins[strings.ToLower(u.Scheme+"://"+u.Host)] {
		return nil
	}
	return &refusal{http.StatusForbidden, "cross-origin request (Origin " + origin + ")"}
}

// jsonBody refuses an API mutation without a JSON content type: an HTML
// form cannot send one, and a cross-site script cannot without a CORS
// preflight this handler never answers.
func jsonBody(r *http.Request) *refusal {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return &refusal{http.StatusUnsupportedMediaType, "state-changing API requests need Content-Type: application/json"}
	}
	return nil
}

// csrfToken is the page's anti-CSRF token for caller.
func (h *Handler) csrfToken(caller string) string {
	m := hmac.New(sha256.New, h.csrfKey)
	m.Write([]byte(caller))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (h *Handler) validToken(caller, token string) bool {
	return hmac.Equal([]byte(h.csrfToken(caller)), []byte(token))
}

// replayLock is held by a replay of k's subscriber; ok false means
// another replay runs.
func (h *Handler) replayLock(k key) (unlock func(), ok bool) {
	v, _ := h.replayMu.LoadOrStore(k, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	if !mu.TryLock() {
		return nil, false
	}
	return mu.Unlock, true
}

// audit logs an action on k's subscriber with its caller and outcome.
func (h *Handler) audit(r *http.Request, caller string, action Action, k key, err error, attrs ...any) {
	base := append(append([]any{"action", string(action), "caller", caller}, k.logAttrs()...), "remote", r.RemoteAddr)
	attrs = append(base, attrs...)
	if err != nil {
		h.cfg.logger.Warn("admin action failed", append(attrs, "error", err)...)
		return
	}
	h.cfg.logger.Info("admin action", attrs...)
}
