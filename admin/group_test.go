package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
)

// groupFixture is a running Group over tenants t1 and t2, with the
// definitions "orders" (partitioned in 3, which parks group.poison events
// while failing is set) and "emails", behind admin.NewGroupHandler mounted under /ops/.
// t1 has one parked event; t2 none.
type groupFixture struct {
	backend envBackend
	group   *subscriptions.Group
	envs    map[string]*env
	poison  domain.EventEnvelope[any] // t1's parked event
	failing atomic.Bool
	mux     *http.ServeMux
	logs    *logBuffer
	handler *admin.Handler
	// asked records the authorizer's questions, as "action tenant/name".
	mu    sync.Mutex
	asked []string
}

// groupAuth: X-User names the caller (none: unauthenticated), X-Role
// "reader" may only read, X-Tenant limits the caller to that tenant's
// subscribers (and its list; not the list of every tenant).
func (f *groupFixture) groupAuth(r *http.Request, action admin.Action, tenant, name string) (string, bool) {
	f.mu.Lock()
	f.asked = append(f.asked, string(action)+" "+tenant+"/"+name)
	f.mu.Unlock()
	user := r.Header.Get("X-User")
	if user == "" {
		return "", false
	}
	if only := r.Header.Get("X-Tenant"); only != "" && tenant != only {
		return user, false
	}
	return user, action == admin.Read || r.Header.Get("X-Role") != "reader"
}

func (f *groupFixture) askedAbout(q string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.asked {
		if a == q {
			return true
		}
	}
	return false
}

// addTenant adds a tenant on a fresh env of the fixture's backend.
func (f *groupFixture) addTenant(t *testing.T, tenant string) *env {
	t.Helper()
	e := f.backend.New(t)
	f.envs[tenant] = e
	db := ""
	if e.Name == "postgres" {
		db = "pg"
	}
	require.NoError(t, f.group.Add(subscriptions.Feed{Tenant: tenant, Database: db, Events: e.Events, Checkpoints: e.Cps, Parking: e.Parking}))
	return e
}

func newGroupFixture(t *testing.T, b envBackend) *groupFixture {
	t.Helper()
	f := &groupFixture{backend: b, envs: map[string]*env{}}
	f.failing.Store(true)
	h := func(_ context.Context, ev domain.EventEnvelope[any]) error {
		if ev.EventType == "group.poison" && f.failing.Load() {
			return errParkPoison
		}
		return nil
	}
	opts := []subscriptions.SubscriberOption{subscriptions.WithMaxRetries(0), subscriptions.WithRetryBackoff(time.Millisecond, 8*time.Millisecond),
		subscriptions.WithPollInterval(10 * time.Millisecond)}
	var err error
	f.group, err = subscriptions.NewGroup([]subscriptions.GroupSubscriber{
		{Name: "orders", Handler: h, Options: append(slices.Clone(opts), subscriptions.WithPartitions(3), subscriptions.WithConcurrency(2))},
		{Name: "emails", Handler: func(context.Context, domain.EventEnvelope[any]) error { return nil }, Options: opts},
	}, subscriptions.WithGroupPollInterval(10*time.Millisecond), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	ctx := context.Background()
	t1 := f.addTenant(t, "t1")
	ev := domain.NewEventEnvelope[any](map[string]any{"secret": "card-4242"}, "acc-1", "group.poison", 0)
	require.NoError(t, t1.Events.Append(ctx, ev.AggregateID, -1, ev))
	f.poison, err = t1.Events.GetEventByID(ctx, ev.ID)
	require.NoError(t, err)
	appendN(t, t1.Events, "group.ok", 0, 2)
	t2 := f.addTenant(t, "t2")
	appendN(t, t2.Events, "group.ok", 0, 4)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.group.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("Group.Run did not return within 30s of its cancellation")
		}
	})
	for _, tenant := range []string{"t1", "t2"} {
		for _, name := range []string{"orders", "emails"} {
			waitCaughtUp(t, f.sub(t, tenant, name))
		}
	}
	parkWaitParked(t, f.sub(t, "t1", "orders"), 1)

	logger, logs := newLogger()
	f.logs = logs
	f.handler, err = admin.NewGroupHandler(f.group, f.groupAuth, admin.WithLogger(logger))
	require.NoError(t, err)
	t.Cleanup(f.handler.Close)
	f.mux = http.NewServeMux()
	f.mux.Handle("/ops/", http.StripPrefix("/ops", f.handler))
	return f
}

func (f *groupFixture) sub(t *testing.T, tenant, name string) *subscriptions.Subscriber {
	t.Helper()
	s, err := f.group.Subscriber(tenant, name)
	require.NoError(t, err)
	return s
}

// do sends a request with the given headers (X-User, X-Role, X-Tenant,
// Content-Type...).
func (f *groupFixture) do(method, path, body string, hdr map[string]string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, "http://admin.test"+path, rd)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.mux.ServeHTTP(w, req)
	return w
}

func hdrs(kv ...string) map[string]string {
	out := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// groupRow is a row of GET api/subscribers as these tests read it.
type groupRow struct {
	Subscriber string
	Tenant     string
	Lag        int64
	Parked     int
	Paused     bool
	Error      string
}

func rowNames(rows []groupRow) []string {
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, r.Tenant+"/"+r.Subscriber)
	}
	return out
}

// pageRows returns the page's subscriber rows as "tenant/name".
func pageRows(body string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`data-subscriber="([^"]*)" data-tenant="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		out = append(out, m[2]+"/"+m[1])
	}
	return out
}

// TestGroupHandler serves a Group's tenants: rows per tenant and name, the
// filter by tenant (API and page), the per-row actions on that tenant's
// subscriber only, the tenant in the authorizer's questions and the audit
// lines, and tenants that come and go. Memory and Postgres.
func TestGroupHandler(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		if b.Name != "memory" && b.Name != "postgres" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f := newGroupFixture(t, b)
			alice := hdrs("X-User", "alice")
			aliceJSON := hdrs("X-User", "alice", "Content-Type", "application/json")
			list := func(query string, hdr map[string]string) []groupRow {
				t.Helper()
				w := f.do("GET", "/ops/api/subscribers"+query, "", hdr)
				require.Equal(t, 200, w.Code, w.Body.String())
				return decodeJSON[struct{ Subscribers []groupRow }](t, w).Subscribers
			}
			path := func(name, tenant string, rest ...string) string {
				p := adminPath(append([]string{name}, rest...)...)
				if tenant != "" {
					p += "?tenant=" + url.QueryEscape(tenant)
				}
				return p
			}

			t.Run("list and filter", func(t *testing.T) {
				rows := list("", alice)
				require.Equal(t, []string{"t1/orders", "t1/emails", "t2/orders", "t2/emails"}, rowNames(rows))
				require.Equal(t, 1, rows[0].Parked, "t1's orders parked its poison event")
				require.Equal(t, 0, rows[2].Parked)
				require.True(t, f.askedAbout("read /"), "the list of every tenant is asked about as (\"\", \"\")")

				require.Equal(t, []string{"t2/orders", "t2/emails"}, rowNames(list("?tenant=t2", alice)))
				require.True(t, f.askedAbout("read t2/"), "a tenant's list is asked about as (tenant, \"\")")
				require.Equal(t, []string{"t1/orders", "t1/emails", "t2/orders", "t2/emails"}, rowNames(list("?tenant=t2&tenant=t1", alice)), "tenants in the page's order")
				require.Len(t, list("?tenant=", alice), 4, "an empty filter is none")

				w := f.do("GET", "/ops/api/subscribers?tenant=nope", "", alice)
				require.Equal(t, 404, w.Code, w.Body.String())
				require.Contains(t, decodeJSON[map[string]string](t, w)["error"], `unknown tenant "nope"`)

				// A caller limited to t1 lists t1 only.
				bob := hdrs("X-User", "bob", "X-Tenant", "t1")
				require.Equal(t, []string{"t1/orders", "t1/emails"}, rowNames(list("?tenant=t1", bob)))
				require.Equal(t, 403, f.do("GET", "/ops/api/subscribers", "", bob).Code)
				require.Equal(t, 403, f.do("GET", "/ops/api/subscribers?tenant=t2", "", bob).Code)
				require.Regexp(t, `msg="admin request refused" reason="not allowed" action=read caller=bob subscriber="" tenant=t2 `, f.logs.String())

				w = f.do("GET", path("orders", "t1"), "", alice)
				require.Equal(t, 200, w.Code, w.Body.String())
				one := decodeJSON[groupRow](t, w)
				require.Equal(t, groupRow{Subscriber: "orders", Tenant: "t1", Parked: 1}, one)
			})

			t.Run("refusals", func(t *testing.T) {
				bob := hdrs("X-User", "bob", "X-Tenant", "t1", "Content-Type", "application/json")
				for _, c := range []struct {
					name, method, path, body string
					hdr                      map[string]string
					want                     int
				}{
					{"no tenant", "GET", path("orders", ""), "", alice, 400},
					{"no tenant, action", "POST", path("orders", "", "pause"), "{}", aliceJSON, 400},
					{"unknown tenant", "GET", path("orders", "nope"), "", alice, 404},
					{"unknown tenant's parked", "GET", path("orders", "nope", "parked"), "", alice, 404},
					{"unknown name", "GET", path("nobody", "t1"), "", alice, 404},
					{"unauthenticated", "GET", path("orders", "t1"), "", nil, 401},
					{"other tenant's pause", "POST", path("orders", "t2", "pause"), "{}", bob, 403},
					{"other tenant's reset", "POST", path("orders", "t2", "reset"), `{"position":0}`, bob, 403},
					{"other tenant's parked", "GET", path("orders", "t2", "parked"), "", bob, 403},
				} {
					w := f.do(c.method, c.path, c.body, c.hdr)
					require.Equal(t, c.want, w.Code, "%s: %s", c.name, w.Body.String())
					require.NotEmpty(t, decodeJSON[map[string]string](t, w)["error"], c.name)
				}
				require.Contains(t, f.do("GET", path("orders", ""), "", alice).Body.String(), "tenant: required")
				require.Regexp(t, `msg="admin request refused" reason="not allowed" action=pause caller=bob subscriber=orders tenant=t2 `, f.logs.String())
				for _, tenant := range []string{"t1", "t2"} {
					st, err := f.sub(t, tenant, "orders").Status(context.Background())
					require.NoError(t, err)
					require.False(t, st.Paused, "no refused request paused %s", tenant)
				}
			})

			t.Run("actions act on the row's tenant", func(t *testing.T) {
				// Pause t2's orders: t1's orders and t2's emails go on.
				w := f.do("POST", path("orders", "t2", "pause"), `{"reason":"t2 migration"}`, aliceJSON)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.JSONEq(t, `"t2"`, string(mustField(t, w.Body.Bytes(), "tenant")))
				require.Regexp(t, `msg="admin action" action=pause caller=alice subscriber=orders tenant=t2 .*reason="t2 migration"`, f.logs.String())
				rows := list("", alice)
				paused := map[string]bool{}
				for _, r := range rows {
					paused[r.Tenant+"/"+r.Subscriber] = r.Paused
				}
				require.Equal(t, map[string]bool{"t1/orders": false, "t1/emails": false, "t2/orders": true, "t2/emails": false}, paused)
				appendN(t, f.envs["t2"].Events, "group.ok", 10, 2)
				appendN(t, f.envs["t1"].Events, "group.ok", 10, 2)
				waitCaughtUp(t, f.sub(t, "t1", "orders"))
				waitCaughtUp(t, f.sub(t, "t2", "emails"))
				lag, err := f.sub(t, "t2", "orders").Lag(context.Background())
				require.NoError(t, err)
				require.Equal(t, int64(2), lag, "t2's orders is paused")
				w = f.do("POST", path("orders", "t2", "resume"), "", aliceJSON)
				require.Equal(t, 200, w.Code, w.Body.String())
				waitCaughtUp(t, f.sub(t, "t2", "orders"))

				// The parked event is t1's: t2's orders has none.
				w = f.do("GET", path("orders", "t2", "parked"), "", alice)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Empty(t, decodeJSON[subscriptions.ParkedPage](t, w).Events)
				w = f.do("GET", path("orders", "t2", "parked", f.poison.ID), "", alice)
				require.Equal(t, 404, w.Code, w.Body.String())
				w = f.do("GET", path("orders", "t1", "parked", f.poison.ID), "", alice)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Contains(t, w.Body.String(), "card-4242")
				f.failing.Store(false)
				w = f.do("POST", path("orders", "t1", "parked", f.poison.ID, "replay"), "{}", aliceJSON)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Regexp(t, `msg="admin action" action=replay caller=alice subscriber=orders tenant=t1 .*event_id=`+regexp.QuoteMeta(f.poison.ID), f.logs.String())
				left, err := f.sub(t, "t1", "orders").ListParked(context.Background())
				require.NoError(t, err)
				require.Empty(t, left)

				// Reset t1's emails only.
				w = f.do("POST", path("emails", "t1", "reset"), `{"position":1}`, aliceJSON)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.JSONEq(t, `{"subscriber":"emails","tenant":"t1","position":1}`, w.Body.String())
				require.Regexp(t, `msg="admin action" action=reset caller=alice subscriber=emails tenant=t1 .*position=1`, f.logs.String())
				waitCaughtUp(t, f.sub(t, "t1", "emails"))
				head, err := f.sub(t, "t2", "emails").Head(context.Background())
				require.NoError(t, err)
				pos, err := f.envs["t2"].Cps.Position(context.Background(), "emails")
				require.NoError(t, err)
				require.Equal(t, head, pos, "t2's emails was not reset")
			})

			t.Run("page", func(t *testing.T) {
				w := f.do("GET", "/ops/", "", alice)
				require.Equal(t, 200, w.Code, w.Body.String())
				body := w.Body.String()
				require.Equal(t, []string{"t1/orders", "t1/emails", "t2/orders", "t2/emails"}, pageRows(body))
				require.Contains(t, body, "<th>Tenant</th>")
				require.Contains(t, body, `<form method="get" action="./" id="tenant-filter">`)
				require.Contains(t, body, `href="./?subscriber=orders&amp;tenant=t2"`, "a row's link names its tenant")

				w = f.do("GET", "/ops/?tenant=t2", "", alice)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Equal(t, []string{"t2/orders", "t2/emails"}, pageRows(w.Body.String()))
				require.Contains(t, w.Body.String(), `name="tenant" value="t2"`, "the filter box shows the filter")
				require.Contains(t, w.Body.String(), `<a href="./">All tenants</a>`)

				w = f.do("GET", "/ops/?tenant=nope", "", alice)
				require.Equal(t, 404, w.Code, w.Body.String())
				require.Contains(t, w.Body.String(), "Unknown tenant nope.")
				require.Empty(t, pageRows(w.Body.String()))

				// A caller limited to t1 sees t1's rows only, and no list of t2.
				bob := hdrs("X-User", "bob", "X-Tenant", "t1")
				w = f.do("GET", "/ops/", "", bob)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Equal(t, []string{"t1/orders", "t1/emails"}, pageRows(w.Body.String()))
				require.Equal(t, 403, f.do("GET", "/ops/?tenant=t2", "", bob).Code)
				require.Equal(t, 403, f.do("GET", "/ops/?tenant=t2&subscriber=orders", "", bob).Code)

				// A selected row: its parked events, forms that carry the tenant.
				f.failing.Store(true)
				ev := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "acc-2", "group.poison", 0)
				require.NoError(t, f.envs["t2"].Events.Append(context.Background(), ev.AggregateID, -1, ev))
				parkWaitParked(t, f.sub(t, "t2", "orders"), 1)
				w = f.do("GET", "/ops/?tenant=t2&subscriber=orders", "", alice)
				require.Equal(t, 200, w.Code, w.Body.String())
				body = w.Body.String()
				require.Contains(t, body, "Parked events of orders (tenant t2)")
				require.Contains(t, body, `data-event-id="`+ev.ID+`"`)
				require.Regexp(t, `action="ui/replay"><input type="hidden" name="csrf" value="[^"]+"><input type="hidden" name="tenant" value="t2">`, body)
				require.Regexp(t, `<tr class="selected" data-subscriber="orders" data-tenant="t2">`, body)
				token := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)[1]
				form := func(action string, v url.Values) *httptest.ResponseRecorder {
					v.Set("csrf", token)
					return f.do("POST", "/ops/ui/"+action, v.Encode(), hdrs("X-User", "alice", "Content-Type", "application/x-www-form-urlencoded"))
				}
				w = form("pause", url.Values{"tenant": {"t2"}, "subscriber": {"orders"}, "confirm": {"yes"}, "reason": {"page"}})
				require.Equal(t, 303, w.Code, w.Body.String())
				require.Equal(t, "../?done=paused&subscriber=orders&tenant=t2", w.Header().Get("Location"))
				st, err := f.sub(t, "t2", "orders").Status(context.Background())
				require.NoError(t, err)
				require.True(t, st.Paused)
				w = form("resume", url.Values{"tenant": {"t2"}, "subscriber": {"orders"}})
				require.Equal(t, 303, w.Code, w.Body.String())
				f.failing.Store(false)
				w = form("replay", url.Values{"tenant": {"t2"}, "subscriber": {"orders"}, "event_id": {ev.ID}})
				require.Equal(t, 303, w.Code, w.Body.String())
				require.Regexp(t, `msg="admin action" action=replay caller=alice subscriber=orders tenant=t2 `, f.logs.String())
				w = form("pause", url.Values{"subscriber": {"orders"}, "confirm": {"yes"}})
				require.Equal(t, 400, w.Code, "a form without its tenant: %s", w.Body.String())
				require.Contains(t, w.Body.String(), "Tenant: required")
				w = form("pause", url.Values{"tenant": {"nope"}, "subscriber": {"orders"}, "confirm": {"yes"}})
				require.Equal(t, 404, w.Code, w.Body.String())
			})

			t.Run("tenants come and go", func(t *testing.T) {
				e := f.addTenant(t, "t3")
				appendN(t, e.Events, "group.ok", 0, 1)
				waitCaughtUp(t, f.sub(t, "t3", "emails"))
				require.Equal(t, []string{"t1/orders", "t1/emails", "t2/orders", "t2/emails", "t3/orders", "t3/emails"}, rowNames(list("", alice)))
				require.Equal(t, []string{"t3/orders", "t3/emails"}, pageRows(f.do("GET", "/ops/?tenant=t3", "", alice).Body.String()))

				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				require.NoError(t, f.group.Remove(ctx, "t2"))
				require.Equal(t, []string{"t1/orders", "t1/emails", "t3/orders", "t3/emails"}, rowNames(list("", alice)))
				require.Equal(t, []string{"t1/orders", "t1/emails", "t3/orders", "t3/emails"}, pageRows(f.do("GET", "/ops/", "", alice).Body.String()))
				w := f.do("POST", path("orders", "t2", "pause"), "{}", aliceJSON)
				require.Equal(t, 404, w.Code, "a removed tenant's subscriber is gone: %s", w.Body.String())
				require.Equal(t, 404, f.do("GET", "/ops/api/subscribers?tenant=t2", "", alice).Code)
			})
		})
	}
}

// mustField returns the raw JSON of body's field.
func mustField(t *testing.T, body []byte, field string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &m), string(body))
	v, ok := m[field]
	require.True(t, ok, "no field %q in %s", field, body)
	return v
}

// TestNewGroupHandlerRefusesBadArguments: a nil group or authorizer, a bad
// option.
func TestNewGroupHandlerRefusesBadArguments(t *testing.T) {
	t.Parallel()
	g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "orders", Handler: func(context.Context, domain.EventEnvelope[any]) error { return nil }}})
	require.NoError(t, err)
	auth := func(*http.Request, admin.Action, string, string) (string, bool) { return "x", true }
	for name, c := range map[string]struct {
		group admin.TenantSource
		auth  admin.TenantAuthorizer
		opts  []admin.Option
		want  string
	}{
		"nil group":       {nil, auth, nil, "group: nil"},
		"nil authorizer":  {g, nil, nil, "authorize"},
		"sample interval": {g, auth, []admin.Option{admin.WithSampleInterval(time.Millisecond)}, "NewGroupHandler: WithSampleInterval"},
	} {
		h, err := admin.NewGroupHandler(c.group, c.auth, c.opts...)
		require.Error(t, err, name)
		require.Nil(t, h, name)
		require.Contains(t, err.Error(), c.want, name)
	}
	// No tenant yet: served, empty (the page too: no row to ask about, so
	// the list is).
	h, err := admin.NewGroupHandler(g, auth)
	require.NoError(t, err)
	defer h.Close()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://admin.test/api/subscribers", nil))
	require.Equal(t, 200, w.Code, w.Body.String())
	require.JSONEq(t, `{"subscribers":[]}`, w.Body.String())
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "http://admin.test/", nil))
	require.Equal(t, 200, w.Code, w.Body.String())
}
