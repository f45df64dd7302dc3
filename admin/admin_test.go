package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
)

// adminFixture is a subscriber with parked events behind an admin handler
// mounted under /ops/.
type adminFixture struct {
	e       *env
	sub     *subscriptions.Subscriber
	other   *subscriptions.Subscriber // never ran: it lags
	poison  []domain.EventEnvelope[any]
	failing atomic.Bool
	block   chan struct{} // when non-nil, the handler waits on it
	entered chan struct{}
	mux     *http.ServeMux
	logs    *logBuffer
}

// adminAuth: header X-User names the caller; X-Role "reader" may only
// read; no X-User is unauthenticated.
func adminAuth(r *http.Request, action admin.Action, _ string) (string, bool) {
	user := r.Header.Get("X-User")
	if user == "" {
		return "", false
	}
	return user, action == admin.Read || r.Header.Get("X-Role") != "reader"
}

func newAdminFixture(t *testing.T, e *env, opts ...admin.Option) *adminFixture {
	t.Helper()
	ctx := context.Background()
	f := &adminFixture{e: e}
	f.failing.Store(true)
	for i := range 3 {
		ev := domain.NewEventEnvelope[any](map[string]any{"secret": "card-4242", "n": i}, "acc-1", "admin.poison", 0)
		require.NoError(t, e.Events.Append(ctx, ev.AggregateID, -1, ev))
		stored, err := e.Events.GetEventByID(ctx, ev.ID)
		require.NoError(t, err)
		f.poison = append(f.poison, stored)
	}
	appendN(t, e.Events, "admin.ok", 0, 2)
	h := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		if ev.EventType != "admin.poison" {
			return nil
		}
		if f.block != nil {
			f.entered <- struct{}{}
			<-f.block
		}
		if f.failing.Load() {
			return errParkPoison
		}
		return nil
	}
	subLogger, _ := newLogger()
	f.sub = parkSubscriber(t, e, "admin-sub", h, subscriptions.WithMaxRetries(0), subscriptions.WithParkingLot(e.Parking), subscriptions.WithLogger(subLogger))
	r := start(t, f.sub)
	parkWaitParked(t, f.sub, 3)
	waitCaughtUp(t, f.sub)
	r.stop(t)
	// A second subscriber that has not started: it lags.
	other := parkSubscriber(t, e, "admin-other", h)
	f.other = other
	logger, logs := newLogger()
	f.logs = logs
	handler := newHandler(t, []*subscriptions.Subscriber{f.sub, other}, adminAuth,
		append([]admin.Option{admin.WithLogger(logger)}, opts...)...)
	f.mux = http.NewServeMux()
	f.mux.Handle("/ops/", http.StripPrefix("/ops", handler))
	return f
}

// do sends a request as user (role "" may act) and returns the response.
func (f *adminFixture) do(method, path, user, role string, body string, hdr map[string]string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, "http://admin.test"+path, rd)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if role != "" {
		req.Header.Set("X-Role", role)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.mux.ServeHTTP(w, req)
	return w
}

var jsonCT = map[string]string{"Content-Type": "application/json"}

func adminPath(parts ...string) string {
	for i := range parts {
		parts[i] = url.PathEscape(parts[i])
	}
	return "/ops/api/subscribers/" + strings.Join(parts, "/")
}

func decodeJSON[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	require.Equal(t, "application/json; charset=utf-8", w.Header().Get("Content-Type"), w.Body.String())
	var v T
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &v), w.Body.String())
	return v
}

func TestNewHandlerRefusesBadArguments(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	nop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	a := parkSubscriber(t, e, "admin-a", nop)
	a2 := parkSubscriber(t, e, "admin-a", nop)
	for name, c := range map[string]struct {
		subs []*subscriptions.Subscriber
		auth admin.Authorizer
		opts []admin.Option
		want string
	}{
		"nil authorizer":  {[]*subscriptions.Subscriber{a}, nil, nil, "authorize"},
		"no subscribers":  {nil, adminAuth, nil, "subscribers"},
		"nil subscriber":  {[]*subscriptions.Subscriber{a, nil}, adminAuth, nil, "subscribers[1]"},
		"duplicate names": {[]*subscriptions.Subscriber{a, a2}, adminAuth, nil, `two named "admin-a"`},
		"bad origin":      {[]*subscriptions.Subscriber{a}, adminAuth, []admin.Option{admin.WithTrustedOrigins("admin.test")}, "WithTrustedOrigins"},
		"sample interval": {[]*subscriptions.Subscriber{a}, adminAuth, []admin.Option{admin.WithSampleInterval(time.Millisecond)}, "WithSampleInterval: 1ms is below 100ms"},
	} {
		h, err := admin.NewHandler(c.subs, c.auth, c.opts...)
		require.Error(t, err, name)
		require.Nil(t, h, name)
		require.Contains(t, err.Error(), c.want, name)
	}
}

// TestAdminHandler runs the admin API and page on every backend.
func TestAdminHandler(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			f := newAdminFixture(t, b.New(t))
			p0, p1, p2 := f.poison[0].ID, f.poison[1].ID, f.poison[2].ID

			t.Run("refusals", func(t *testing.T) {
				replay := adminPath("admin-sub", "parked", p0, "replay")
				for _, c := range []struct {
					name         string
					method, path string
					user, role   string
					body         string
					hdr          map[string]string
					want         int
				}{
					{"unauthenticated list", "GET", "/ops/api/subscribers", "", "", "", nil, 401},
					{"unauthenticated page", "GET", "/ops/", "", "", "", nil, 401},
					{"unauthenticated unknown subscriber", "GET", adminPath("nobody"), "", "", "", nil, 401},
					{"reader replays", "POST", replay, "bob", "reader", "{}", jsonCT, 403},
					{"reader discards", "DELETE", adminPath("admin-sub", "parked", p0), "bob", "reader", "", jsonCT, 403},
					{"reader resets", "POST", adminPath("admin-sub", "reset"), "bob", "reader", `{"position":0}`, jsonCT, 403},
					{"form content type", "POST", replay, "alice", "", "a=b", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
					{"no content type", "POST", replay, "alice", "", "", nil, 415},
					{"discard without JSON", "DELETE", adminPath("admin-sub", "parked", p0), "alice", "", "", nil, 415},
					{"cross-origin", "POST", replay, "alice", "", "{}", map[string]string{"Content-Type": "application/json", "Origin": "https://evil.test"}, 403},
					{"null origin", "POST", replay, "alice", "", "{}", map[string]string{"Content-Type": "application/json", "Origin": "null"}, 403},
					{"cross-site referer", "POST", replay, "alice", "", "{}", map[string]string{"Content-Type": "application/json", "Referer": "https://evil.test/x"}, 403},
					{"sec-fetch-site", "POST", replay, "alice", "", "{}", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403},
					{"GET on an action", "GET", replay, "alice", "", "", nil, 405},
					{"PUT on a parked event", "PUT", adminPath("admin-sub", "parked", p0), "alice", "", "{}", jsonCT, 405},
					{"unknown route", "GET", "/ops/api/nothing", "alice", "", "", nil, 404},
					{"unknown subscriber", "GET", adminPath("nobody"), "alice", "", "", nil, 404},
					{"unknown subscriber's parked", "GET", adminPath("nobody", "parked"), "alice", "", "", nil, 404},
					{"unknown event", "GET", adminPath("admin-sub", "parked", "no-such-event"), "alice", "", "", nil, 404},
					{"discard unknown event", "DELETE", adminPath("admin-sub", "parked", "no-such-event"), "alice", "", "", jsonCT, 404},
					{"replay unknown event", "POST", adminPath("admin-sub", "parked", "no-such-event", "replay"), "alice", "", "{}", jsonCT, 404},
					{"reset negative", "POST", adminPath("admin-sub", "reset"), "alice", "", `{"position":-1}`, jsonCT, 400},
					{"reset beyond the head", "POST", adminPath("admin-sub", "reset"), "alice", "", `{"position":1000000}`, jsonCT, 400},
					{"reset without position", "POST", adminPath("admin-sub", "reset"), "alice", "", `{}`, jsonCT, 400},
					{"reset not a number", "POST", adminPath("admin-sub", "reset"), "alice", "", `{"position":"x"}`, jsonCT, 400},
					{"reset unknown field", "POST", adminPath("admin-sub", "reset"), "alice", "", `{"position":1,"x":1}`, jsonCT, 400},
					{"bad cursor", "GET", adminPath("admin-sub", "parked") + "?after=x", "alice", "", "", nil, 400},
					{"bad limit", "GET", adminPath("admin-sub", "parked") + "?limit=0", "alice", "", "", nil, 400},
				} {
					w := f.do(c.method, c.path, c.user, c.role, c.body, c.hdr)
					require.Equal(t, c.want, w.Code, "%s: %s", c.name, w.Body.String())
					if strings.Contains(c.path, "/api/") {
						require.NotEmpty(t, decodeJSON[map[string]string](t, w)["error"], c.name)
					}
				}
				parked, err := f.sub.ListParked(context.Background())
				require.NoError(t, err)
				require.Len(t, parked, 3, "no refused request changed anything")
				require.Contains(t, f.logs.String(), "admin request refused")
				require.Contains(t, f.logs.String(), "caller=bob")
			})

			t.Run("status and parked events", func(t *testing.T) {
				w := f.do("GET", "/ops/api/subscribers", "alice", "reader", "", nil)
				require.Equal(t, 200, w.Code)
				got := decodeJSON[struct {
					Subscribers []struct {
						Subscriber string
						Position   int64
						Head       int64
						Lag        int64
						LagSeconds float64 `json:"lag_seconds"`
						Parked     int
						State      string
					}
				}](t, w).Subscribers
				require.Len(t, got, 2)
				require.Equal(t, "admin-other", got[0].Subscriber)
				require.Equal(t, got[0].Head, got[0].Lag, "a subscriber that never ran lags by the whole feed")
				require.Greater(t, got[0].LagSeconds, 0.0)
				require.Equal(t, "stopped", got[0].State, "its Run never ran in this process")
				require.Equal(t, -1, got[0].Parked, "no parking lot")
				require.Equal(t, "admin-sub", got[1].Subscriber)
				require.Equal(t, int64(0), got[1].Lag)
				require.Equal(t, "stopped", got[1].State, "its Run was stopped")
				require.Equal(t, 3, got[1].Parked)

				w = f.do("GET", adminPath("admin-sub", "parked")+"?limit=2", "alice", "reader", "", nil)
				require.Equal(t, 200, w.Code)
				page := decodeJSON[subscriptions.ParkedPage](t, w)
				require.Equal(t, []string{p0, p1}, parkedIDs(page.Events))
				require.True(t, page.More)
				w = f.do("GET", adminPath("admin-sub", "parked")+"?limit=2&after="+jsonInt(page.NextAfter), "alice", "reader", "", nil)
				require.Equal(t, []string{p2}, parkedIDs(decodeJSON[subscriptions.ParkedPage](t, w).Events))

				w = f.do("GET", adminPath("admin-sub", "parked", p1), "alice", "reader", "", nil)
				require.Equal(t, 200, w.Code)
				require.Contains(t, w.Body.String(), "card-4242", "the payload is shown")
				detail := decodeJSON[map[string]map[string]any](t, w)
				require.Equal(t, "admin.poison", detail["event"]["type"])
				require.Equal(t, float64(f.poison[1].Position), detail["event"]["position"])
				require.Equal(t, "acc-1", detail["parked"]["aggregate_id"])
				require.Contains(t, detail["parked"]["error"], errParkPoison.Error())
			})

			t.Run("replay in progress", func(t *testing.T) {
				f.block, f.entered = make(chan struct{}), make(chan struct{}, 1)
				defer func() { f.block = nil }()
				first := make(chan *httptest.ResponseRecorder, 1)
				go func() {
					first <- f.do("POST", adminPath("admin-sub", "parked", p0, "replay"), "alice", "", "{}", jsonCT)
				}()
				<-f.entered
				w := f.do("POST", adminPath("admin-sub", "parked", p1, "replay"), "alice", "", "{}", jsonCT)
				require.Equal(t, 409, w.Code, w.Body.String())
				w = f.do("POST", adminPath("admin-sub", "replay"), "alice", "", "{}", jsonCT)
				require.Equal(t, 409, w.Code, w.Body.String())
				close(f.block)
				w = <-first
				require.Equal(t, 422, w.Code, "the handler still fails: %s", w.Body.String())
				p, err := f.sub.GetParked(context.Background(), p0)
				require.NoError(t, err)
				require.Equal(t, 2, p.Attempts, "the failed replay is recorded")
			})

			t.Run("replay, discard and reset", func(t *testing.T) {
				f.failing.Store(false)
				w := f.do("POST", adminPath("admin-sub", "parked", p0, "replay"), "alice", "", "{}", map[string]string{"Content-Type": "application/json", "Origin": "http://admin.test"})
				require.Equal(t, 200, w.Code, w.Body.String())
				w = f.do("DELETE", adminPath("admin-sub", "parked", p1), "carol", "", "", jsonCT)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Contains(t, f.logs.String(), "action=discard caller=carol")
				require.Regexp(t, `action=discard caller=carol .*event_id=`+regexp.QuoteMeta(p1)+` event_type=admin.poison position=\d+ parked_error=`, f.logs.String(), "the audit line names the event and its error")
				w = f.do("POST", adminPath("admin-sub", "replay"), "alice", "", `{"event_type":"admin.poison","continue_on_error":true}`, jsonCT)
				require.Equal(t, 200, w.Code, w.Body.String())
				res := decodeJSON[subscriptions.ParkedReplayResult](t, w)
				require.Equal(t, []string{p2}, res.Replayed)
				left, err := f.sub.ListParked(context.Background())
				require.NoError(t, err)
				require.Empty(t, left)
				w = f.do("POST", adminPath("admin-sub", "reset"), "alice", "", `{"position":1}`, jsonCT)
				require.Equal(t, 200, w.Code, w.Body.String())
				st := decodeJSON[map[string]any](t, f.do("GET", adminPath("admin-sub"), "alice", "", "", nil))
				require.Equal(t, float64(1), st["position"])
				require.Contains(t, f.logs.String(), "action=reset caller=alice")
			})
		})
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestAdminRedactsPayloads: with WithAdminRedactedPayloads the payload
// never leaves the handler, in the API or on the page.
func TestAdminRedactsPayloads(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t, envBackends()[0].New(t), admin.WithRedactedPayloads())
	w := f.do("GET", adminPath("admin-sub", "parked", f.poison[0].ID), "alice", "", "", nil)
	require.Equal(t, 200, w.Code)
	require.NotContains(t, w.Body.String(), "card-4242")
	require.Contains(t, w.Body.String(), `"redacted":true`)
	w = f.do("GET", "/ops/?subscriber=admin-sub&event="+url.QueryEscape(f.poison[0].ID), "alice", "", "", nil)
	require.Equal(t, 200, w.Code)
	require.NotContains(t, w.Body.String(), "card-4242")
	require.Contains(t, w.Body.String(), "(redacted)")
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestAdminPage drives the HTML page as a browser without JavaScript
// would: the tables, then the replay and discard forms with their token.
func TestAdminPage(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t, envBackends()[0].New(t))
	w := f.do("GET", "/ops/", "alice", "", "", nil)
	require.Equal(t, 200, w.Code)
	body := w.Body.String()
	require.Contains(t, body, `data-subscriber="admin-sub"`)
	require.Contains(t, body, `data-subscriber="admin-other"`)
	require.NotContains(t, body, "<script", "no JavaScript needed")
	require.NotContains(t, body, "http://", "no external assets")
	require.NotContains(t, body, "https://", "no external assets")
	require.Contains(t, w.Header().Get("Content-Security-Policy"), "default-src 'none'")

	w = f.do("GET", "/ops/?subscriber=admin-sub", "alice", "", "", nil)
	require.Equal(t, 200, w.Code)
	body = w.Body.String()
	for _, ev := range f.poison {
		require.Contains(t, body, `data-event-id="`+ev.ID+`"`)
	}
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(t, m, "the forms carry a token")
	token := m[1]
	// form posts a page form; hdr holds headers, and "confirm" the
	// discard's confirmation box.
	form := func(action, id, tok, user string, hdr map[string]string) *httptest.ResponseRecorder {
		v := url.Values{"subscriber": {"admin-sub"}, "event_id": {id}, "csrf": {tok}}
		h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
		for k, x := range hdr {
			if k == "confirm" {
				v.Set(k, x)
				continue
			}
			h[k] = x
		}
		return f.do("POST", "/ops/ui/"+action, user, "", v.Encode(), h)
	}
	id := f.poison[0].ID
	require.Equal(t, 403, form("replay", id, "", "alice", nil).Code, "no token")
	require.Equal(t, 403, form("replay", id, token, "mallory", nil).Code, "another caller's token")
	require.Equal(t, 403, form("replay", id, token, "alice", map[string]string{"Origin": "https://evil.test"}).Code, "cross-origin")
	require.Equal(t, 403, form("discard", id, token, "alice", map[string]string{"Sec-Fetch-Site": "cross-site"}).Code, "cross-site")

	w = form("replay", id, token, "alice", map[string]string{"Origin": "http://admin.test", "Sec-Fetch-Site": "same-origin"})
	require.Equal(t, 422, w.Code, "the handler still fails: the page shows why")
	require.Contains(t, w.Body.String(), errParkPoison.Error())

	f.failing.Store(false)
	w = form("replay", id, token, "alice", map[string]string{"Origin": "http://admin.test"})
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	loc, err := url.Parse(w.Header().Get("Location"))
	require.NoError(t, err)
	target := (&url.URL{Path: "/ops/ui/replay"}).ResolveReference(loc)
	require.Equal(t, "/ops/", target.Path)
	w = f.do("GET", target.RequestURI(), "alice", "", "", nil)
	require.Equal(t, 200, w.Code)
	require.Contains(t, w.Body.String(), "Replayed")
	require.NotContains(t, w.Body.String(), `data-event-id="`+id+`"`)

	w = form("discard", f.poison[1].ID, token, "alice", nil)
	require.Equal(t, http.StatusBadRequest, w.Code, "a discard needs its confirmation box")
	require.Contains(t, w.Body.String(), "Not discarded")
	w = form("discard", f.poison[1].ID, token, "alice", map[string]string{"confirm": "yes"})
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	require.Contains(t, f.logs.String(), "action=discard caller=alice")
	left, err := f.sub.ListParked(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{f.poison[2].ID}, parkedIDs(left))
}

// TestAdminHostileNames: subscriber names with markup, slashes and
// quotes are escaped on the page and addressable through the API.
func TestAdminHostileNames(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	nop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	names := []string{`<script>alert("x")</script>`, "a/b/../c", `q"uote'&amp;`, "パーク 🚗"}
	var subs []*subscriptions.Subscriber
	for _, n := range names {
		subs = append(subs, parkSubscriber(t, e, n, nop, subscriptions.WithParkingLot(e.Parking)))
		require.NoError(t, e.Parking.Park(context.Background(), subscriptions.ParkedEvent{Subscriber: n, EventID: "<b>ev</b>/1", Position: 1, Error: "<img src=x onerror=alert(1)>"}))
	}
	h := newHandler(t, subs, adminAuth)
	f := &adminFixture{mux: http.NewServeMux()}
	f.mux.Handle("/ops/", http.StripPrefix("/ops", h))
	for _, n := range names {
		w := f.do("GET", "/ops/?subscriber="+url.QueryEscape(n), "alice", "", "", nil)
		require.Equal(t, 200, w.Code, n)
		body := w.Body.String()
		require.NotContains(t, body, "<script>")
		require.NotContains(t, body, "<img")
		require.NotContains(t, body, "<b>ev")
		require.Contains(t, body, `data-event-id="&lt;b&gt;ev&lt;/b&gt;/1"`, n)

		w = f.do("GET", adminPath(n, "parked", "<b>ev</b>/1"), "alice", "", "", nil)
		require.Equal(t, 200, w.Code, "%s: %s", n, w.Body.String())
		got := decodeJSON[struct{ Parked subscriptions.ParkedEvent }](t, w)
		require.Equal(t, n, got.Parked.Subscriber)
		require.Equal(t, "<b>ev</b>/1", got.Parked.EventID)
	}
}

// TestAdminTrustedOrigins: an origin listed with WithAdminTrustedOrigins
// may act (a proxy rewrote Host); any other origin is still refused.
func TestAdminTrustedOrigins(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t, envBackends()[0].New(t), admin.WithTrustedOrigins("https://ops.example.com"))
	reset := adminPath("admin-sub", "reset")
	hdr := func(origin string) map[string]string {
		return map[string]string{"Content-Type": "application/json", "Origin": origin}
	}
	w := f.do("POST", reset, "alice", "", `{"position":1}`, hdr("https://evil.example.com"))
	require.Equal(t, 403, w.Code, w.Body.String())
	w = f.do("POST", reset, "alice", "", `{"position":1}`, hdr("https://OPS.example.com"))
	require.Equal(t, 200, w.Code, w.Body.String())
	st := decodeJSON[map[string]any](t, f.do("GET", adminPath("admin-sub"), "alice", "", "", nil))
	require.Equal(t, float64(1), st["position"])
}

// TestAdminPageShowsOnlyReadableSubscribers: a caller whose authorizer
// allows only "admin-sub" sees that subscriber on every render of the page
// (the root, the subscriber selected, one event shown, and the re-renders
// after a failed replay and a refused discard) and never another
// subscriber's name, state or lag (its row); a caller who may read
// everything sees them all, and one who may read nothing is refused.
func TestAdminPageShowsOnlyReadableSubscribers(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			f := newAdminFixture(t, b.New(t))
			// payroll-b halts on its first event (no parking lot) and stays
			// halted, lagging, until the test ends.
			const secretErr = "payroll-b ledger 7731 refused"
			hidden := parkSubscriber(t, f.e, "payroll-b", func(context.Context, domain.EventEnvelope[any]) error {
				return errors.New(secretErr)
			})
			start(t, hidden)
			st := statusWait(t, hidden, "halted", func(st subscriptions.Status) bool { return st.State == subscriptions.StateHalted })
			require.Contains(t, st.LastError, secretErr)
			require.Positive(t, st.Lag)

			auth := func(r *http.Request, action admin.Action, subscriber string) (string, bool) {
				switch user := r.Header.Get("X-User"); user {
				case "alice":
					return user, true
				case "team-a":
					return user, subscriber == "admin-sub"
				default:
					return user, false
				}
			}
			handler := newHandler(t, []*subscriptions.Subscriber{f.sub, hidden, f.other}, auth,
				admin.WithLogger(quietLogger()))
			f.mux = http.NewServeMux()
			f.mux.Handle("/ops/", http.StripPrefix("/ops", handler))

			// The check can fail: alice sees what team-a must not.
			w := f.do("GET", "/ops/", "alice", "", "", nil)
			require.Equal(t, 200, w.Code, w.Body.String())
			require.Contains(t, w.Body.String(), `data-subscriber="payroll-b"`)
			require.Contains(t, w.Body.String(), `class="state-halted"`)
			require.Contains(t, w.Body.String(), `data-subscriber="admin-other"`)
			w = f.do("GET", "/ops/api/subscribers", "alice", "", "", nil)
			require.Equal(t, 200, w.Code, w.Body.String())
			require.Contains(t, w.Body.String(), secretErr)

			onlyA := func(what string, w *httptest.ResponseRecorder, code int) {
				t.Helper()
				body := w.Body.String()
				require.Equal(t, code, w.Code, "%s: %s", what, body)
				require.Contains(t, body, `data-subscriber="admin-sub"`, what)
				require.Equal(t, 1, strings.Count(body, "data-subscriber="), "%s: one row, admin-sub's", what)
				for _, leak := range []string{"payroll-b", `class="state-halted"`, secretErr, "admin-other"} {
					require.NotContains(t, body, leak, what)
				}
			}
			w = f.do("GET", "/ops/?subscriber=admin-sub", "team-a", "", "", nil)
			onlyA("admin-sub selected", w, 200)
			m := csrfField.FindStringSubmatch(w.Body.String())
			require.NotNil(t, m, "the forms carry a token")
			onlyA("one event shown", f.do("GET", "/ops/?subscriber=admin-sub&event="+url.QueryEscape(f.poison[0].ID), "team-a", "", "", nil), 200)

			form := func(action string, v url.Values) *httptest.ResponseRecorder {
				v.Set("csrf", m[1])
				return f.do("POST", "/ops/ui/"+action, "team-a", "", v.Encode(), map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
			}
			onlyA("a failed replay's re-render", form("replay", url.Values{"subscriber": {"admin-sub"}, "event_id": {f.poison[0].ID}}), http.StatusUnprocessableEntity)
			onlyA("an unconfirmed discard's re-render", form("discard", url.Values{"subscriber": {"admin-sub"}, "event_id": {f.poison[0].ID}}), http.StatusBadRequest)
			onlyA("an unknown event's re-render", form("replay", url.Values{"subscriber": {"admin-sub"}, "event_id": {"no-such-event"}}), http.StatusNotFound)
			onlyA("the root", f.do("GET", "/ops/", "team-a", "", "", nil), 200)

			for what, w := range map[string]*httptest.ResponseRecorder{
				"payroll-b selected": f.do("GET", "/ops/?subscriber=payroll-b", "team-a", "", "", nil),
				"payroll-b replayed": form("replay", url.Values{"subscriber": {"payroll-b"}, "event_id": {"x"}}),
				"payroll-b by API":   f.do("GET", adminPath("payroll-b"), "team-a", "", "", nil),
				"the API's list":     f.do("GET", "/ops/api/subscribers", "team-a", "", "", nil),
			} {
				require.Equal(t, http.StatusForbidden, w.Code, what)
				require.NotContains(t, w.Body.String(), secretErr, what)
			}
			require.Equal(t, http.StatusForbidden, f.do("GET", "/ops/", "mallory", "", "", nil).Code, "a caller who may read nothing")
			require.Equal(t, http.StatusUnauthorized, f.do("GET", "/ops/", "", "", "", nil).Code)
		})
	}
}

// TestAdminPagePartitions: the page shows each partitioned subscriber's
// partition count and, in a details element (open by itself when a
// partition needs attention), each partition's state, position and lag;
// a stuck partition and a failing one are flagged. The API serves the
// same partitions. Memory and Postgres: there a hung partition does not
// hold the others back (on SQLite its batch holds the write lock).
func TestAdminPagePartitions(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		if b.Name != "memory" && b.Name != "postgres" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			const n = 3
			hung, bad, good := aggregateIn(0, n, "hung"), aggregateIn(1, n, "bad"), aggregateIn(2, n, "good")
			for _, agg := range []string{hung, bad, good, good} {
				ev := domain.NewEventEnvelope[any](map[string]any{}, agg, "part."+strings.TrimRight(agg, "-0123456789"), 0)
				require.NoError(t, e.Events.Append(ctx, agg, -1, ev))
			}
			nop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
			// quiet-p caught up and stopped: nothing needs attention.
			quiet := parkSubscriber(t, e, "quiet-p", nop, subscriptions.WithPartitions(2))
			r := start(t, quiet)
			waitCaughtUp(t, quiet)
			r.stop(t)
			plain := parkSubscriber(t, e, "plain", nop)

			release, entered := make(chan struct{}), make(chan struct{}, 1)
			defer close(release) // before start's cleanup stops Run
			orders := parkSubscriber(t, e, "orders-p", func(_ context.Context, ev domain.EventEnvelope[any]) error {
				switch ev.AggregateID {
				case hung:
					entered <- struct{}{}
					<-release
				case bad:
					return errors.New("cannot handle a bad order")
				}
				return nil
			}, subscriptions.WithPartitions(n), subscriptions.WithConcurrency(n), subscriptions.WithBatchSize(1),
				subscriptions.WithStuckThreshold(200*time.Millisecond))
			start(t, orders)
			select {
			case <-entered: // partition 0 runs its batch from now on
			case <-time.After(30 * time.Second):
				t.Fatal("partition 0's handler never ran")
			}

			handler := newHandler(t, []*subscriptions.Subscriber{orders, quiet, plain}, adminAuth)
			f := &adminFixture{mux: http.NewServeMux()}
			f.mux.Handle("/ops/", http.StripPrefix("/ops", handler))
			// rowOf is subscriber's row of the subscribers table, with the
			// partitions table nested in it: up to the next row.
			rowOf := func(body, subscriber string) string {
				t.Helper()
				for _, seg := range strings.Split(body, "data-subscriber=")[1:] {
					if strings.HasPrefix(seg, `"`+subscriber+`"`) {
						return seg
					}
				}
				require.Failf(t, "no row", "no row for %s in:\n%s", subscriber, body)
				return ""
			}
			partitionRow := func(row string, p int) string {
				t.Helper()
				m := regexp.MustCompile(fmt.Sprintf(`(?s)<tr data-partition="%d"[^>]*>.*?</tr>`, p)).FindString(row)
				require.NotEmpty(t, m, "no partition %d in:\n%s", p, row)
				return m
			}

			// Partition 0 hangs (stuck once the threshold passed) and
			// partition 1 halts on its event.
			var body string
			caughtUp := regexp.MustCompile(`<td class="num">0</td>\s*<td class="num">0s</td>`)
			require.Eventually(t, func() bool {
				w := f.do("GET", "/ops/", "alice", "", "", nil)
				body = w.Body.String()
				return w.Code == 200 && strings.Contains(body, `<tr data-partition="0" class="stuck">`) &&
					strings.Contains(body, `<tr data-partition="1" class="failing">`) &&
					caughtUp.MatchString(regexp.MustCompile(`(?s)<tr data-partition="2"[^>]*>.*?</tr>`).FindString(body))
			}, 30*time.Second, 10*time.Millisecond, "the page never flagged the stuck and the failing partition, with partition 2 caught up")

			row := rowOf(body, "orders-p")
			require.Contains(t, row, "<details open>", "a partition needs attention: shown without being asked")
			require.Contains(t, row, `<span class="partition-count">3</span> partitions`)
			require.Contains(t, row, `<span class="error">1 failing</span>`)
			require.Contains(t, row, `<span class="error">1 stuck</span>`)
			p0 := partitionRow(row, 0)
			require.Contains(t, p0, `class="state-running">running`)
			require.Contains(t, p0, "stuck: checkpoint unchanged for ")
			require.Regexp(t, `<td class="num">1</td>\s*<td class="num">[^<]+</td>`, p0, "lag 1 event, and its age")
			p1 := partitionRow(row, 1)
			require.Contains(t, p1, `class="state-halted">halted <span class="error">(retrying part.bad at `)
			require.NotContains(t, p1, "stuck")
			p2 := partitionRow(row, 2)
			require.Regexp(t, `class="state-(idle|running)">(idle|running)<`, p2, "caught up: idle between polls, running during one")
			require.Regexp(t, caughtUp, p2, "caught up")

			row = rowOf(body, "quiet-p")
			require.Contains(t, row, "<details>", "nothing needs attention: shown on demand")
			require.Contains(t, row, `<span class="partition-count">2</span> partitions</summary>`)
			for p := range 2 {
				require.Contains(t, partitionRow(row, p), `class="state-stopped">stopped`)
			}
			row = rowOf(body, "plain")
			require.NotContains(t, row, "<details")
			require.NotContains(t, row, "data-partition")

			w := f.do("GET", adminPath("orders-p"), "alice", "", "", nil)
			require.Equal(t, 200, w.Code, w.Body.String())
			got := decodeJSON[struct {
				Partitions []struct {
					Partition int
					State     string
					Lag       int64
					Failing   *subscriptions.EventRef
				}
				Stuck []int `json:"stuck_partitions"`
			}](t, w)
			require.Len(t, got.Partitions, n)
			require.Equal(t, "running", got.Partitions[0].State)
			require.EqualValues(t, 1, got.Partitions[0].Lag)
			require.Equal(t, "halted", got.Partitions[1].State)
			require.NotNil(t, got.Partitions[1].Failing)
			require.Equal(t, "part.bad", got.Partitions[1].Failing.Type)
			require.Equal(t, []int{0}, got.Stuck)
		})
	}
}
