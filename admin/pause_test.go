package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
)

// handledCounter counts each event's handler calls, across replicas.
type handledCounter struct {
	mu    sync.Mutex
	calls map[string]int
	total int
}

func (c *handledCounter) handle(_ context.Context, ev domain.EventEnvelope[any]) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[ev.ID]++
	c.total++
	return nil
}

func (c *handledCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// requireOnce requires that the feed up to its head was handled exactly
// once per event.
func (c *handledCounter) requireOnce(t *testing.T, events domain.EventStore) {
	t.Helper()
	all, err := events.ReadAfter(context.Background(), 0, 10_000)
	require.NoError(t, err)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range all {
		require.Equal(t, 1, c.calls[ev.ID], "event %s at %d", ev.ID, ev.Position)
	}
}

// pauseAuth: X-User "ops" may do anything; "team-a" anything on "orders"
// only; any other user only read. Every question is recorded.
type pauseAuth struct {
	mu    sync.Mutex
	asked []string
}

func (a *pauseAuth) authorize(r *http.Request, action admin.Action, subscriber string) (string, bool) {
	a.mu.Lock()
	a.asked = append(a.asked, string(action)+" "+subscriber)
	a.mu.Unlock()
	switch user := r.Header.Get("X-User"); user {
	case "":
		return "", false
	case "ops":
		return user, true
	case "team-a":
		return user, action == admin.Read || subscriber == "orders"
	default:
		return user, action == admin.Read
	}
}

func (a *pauseAuth) wasAsked(q string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, x := range a.asked {
		if x == q {
			return true
		}
	}
	return false
}

// TestAdminPause: the API's pause and resume, on every backend, for a
// partitioned subscriber and a plain one. The handler serves Subscriber
// values of its own while replicas of the names run elsewhere (other
// Subscriber values, as in other processes). Refused requests
// (authorization per subscriber, the JSON content type, cross-origin, a
// wrong method, a bad body) pause nothing; a pause stops every replica
// and partition while events are appended, the status (API and every
// replica's Status) and the page show since when and why, a second pause
// keeps the first; resume lets every replica go on, and each event is
// handled exactly once.
func TestAdminPause(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			ctx := context.Background()
			counters := map[string]*handledCounter{"orders": {}, "plain": {}}
			appendN(t, e.Events, "pause.ev", 0, 9)
			opts := map[string][]subscriptions.SubscriberOption{
				"orders": {subscriptions.WithPartitions(3), subscriptions.WithConcurrency(3)},
				"plain":  nil,
			}
			var replicas, served []*subscriptions.Subscriber
			for _, name := range []string{"orders", "plain"} {
				for range 2 {
					r := parkSubscriber(t, e, name, counters[name].handle, opts[name]...)
					start(t, r)
					replicas = append(replicas, r)
				}
				served = append(served, parkSubscriber(t, e, name, counters[name].handle, opts[name]...))
			}
			for _, r := range replicas {
				waitCaughtUp(t, r)
			}
			auth := &pauseAuth{}
			logger, logs := newLogger()
			f := &adminFixture{mux: http.NewServeMux()}
			f.mux.Handle("/ops/", http.StripPrefix("/ops", newHandler(t, served, auth.authorize, admin.WithLogger(logger))))

			pauseOrders := adminPath("orders", "pause")
			for _, c := range []struct {
				name, method, path, user, body string
				hdr                            map[string]string
				want                           int
			}{
				{"unauthenticated", "POST", pauseOrders, "", `{}`, jsonCT, 401},
				{"a reader", "POST", pauseOrders, "bob", `{}`, jsonCT, 403},
				{"another team's subscriber", "POST", adminPath("plain", "pause"), "team-a", `{}`, jsonCT, 403},
				{"another team's resume", "POST", adminPath("plain", "resume"), "team-a", ``, jsonCT, 403},
				{"no JSON", "POST", pauseOrders, "ops", `reason=x`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
				{"cross-origin", "POST", pauseOrders, "ops", `{}`, map[string]string{"Content-Type": "application/json", "Origin": "https://evil.test"}, 403},
				{"cross-site", "POST", pauseOrders, "ops", `{}`, map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403},
				{"GET", "GET", pauseOrders, "ops", ``, nil, 405},
				{"DELETE", "DELETE", adminPath("orders", "resume"), "ops", ``, jsonCT, 405},
				{"unknown subscriber", "POST", adminPath("nobody", "pause"), "ops", `{}`, jsonCT, 404},
				{"no body", "POST", pauseOrders, "ops", ``, jsonCT, 400},
				{"reason not a string", "POST", pauseOrders, "ops", `{"reason":1}`, jsonCT, 400},
				{"unknown field", "POST", pauseOrders, "ops", `{"reason":"x","why":"y"}`, jsonCT, 400},
			} {
				w := f.do(c.method, c.path, c.user, "", c.body, c.hdr)
				require.Equal(t, c.want, w.Code, "%s: %s", c.name, w.Body.String())
				require.NotEmpty(t, decodeJSON[map[string]string](t, w)["error"], c.name)
			}
			for _, s := range served {
				st, err := s.Status(ctx)
				require.NoError(t, err)
				require.False(t, st.Paused, "%s: no refused request paused it", s.Name())
			}
			require.True(t, auth.wasAsked("pause plain"), "the authorizer is asked about the action and the subscriber")
			require.True(t, auth.wasAsked("resume plain"))
			require.Contains(t, logs.String(), "admin request refused")

			// team-a pauses its subscriber, ops the other one.
			type state struct {
				Subscriber string
				Paused     bool
				PausedAt   time.Time `json:"paused_at"`
				Reason     string
			}
			w := f.do("POST", pauseOrders, "team-a", "", `{"reason":"bad deploy 4.2"}`, jsonCT)
			require.Equal(t, 200, w.Code, w.Body.String())
			got := decodeJSON[state](t, w)
			require.Equal(t, "orders", got.Subscriber)
			require.True(t, got.Paused)
			require.Equal(t, "bad deploy 4.2", got.Reason)
			require.False(t, got.PausedAt.IsZero())
			require.Regexp(t, `action=pause caller=team-a subscriber=orders .*reason="bad deploy 4.2"`, logs.String(), "the audit line")
			w = f.do("POST", adminPath("plain", "pause"), "ops", "", `{}`, jsonCT)
			require.Equal(t, 200, w.Code, w.Body.String())
			plain := decodeJSON[state](t, w)
			require.True(t, plain.Paused)
			require.Empty(t, plain.Reason, "no reason given")

			before := counters["orders"].count() + counters["plain"].count()
			appendN(t, e.Events, "pause.more", 9, 12)
			require.Never(t, func() bool { return counters["orders"].count()+counters["plain"].count() != before }, 300*time.Millisecond, 5*time.Millisecond,
				"a replica handled an event while its name was paused")
			for _, r := range replicas {
				st, err := r.Status(ctx)
				require.NoError(t, err)
				require.True(t, st.Paused, "%s: every replica's Status", r.Name())
				require.Positive(t, st.Lag)
				if r.Name() == "orders" {
					require.Equal(t, got.PausedAt, st.PausedAt)
					require.Equal(t, "bad deploy 4.2", st.PauseReason)
				}
			}
			w = f.do("GET", adminPath("orders"), "bob", "", "", nil)
			require.Equal(t, 200, w.Code, w.Body.String())
			status := decodeJSON[map[string]any](t, w)
			require.Equal(t, true, status["paused"])
			require.Equal(t, "bad deploy 4.2", status["pause_reason"])
			require.Equal(t, got.PausedAt.Format(time.RFC3339Nano), status["paused_at"])
			require.Len(t, status["partitions"], 3, "one pause for every partition")

			// A second pause keeps the first.
			w = f.do("POST", pauseOrders, "ops", "", `{"reason":"another"}`, jsonCT)
			require.Equal(t, 200, w.Code, w.Body.String())
			require.Equal(t, got, decodeJSON[state](t, w))

			// The page shows the pause and offers Resume instead of Pause.
			w = f.do("GET", "/ops/", "bob", "", "", nil)
			require.Equal(t, 200, w.Code)
			body := w.Body.String()
			for _, name := range []string{"orders", "plain"} {
				row := pageRow(t, body, name)
				require.Contains(t, row, `<span class="paused">paused everywhere since `, name)
				require.Contains(t, row, `action="ui/resume"`, name)
				require.NotContains(t, row, `action="ui/pause"`, name)
			}
			require.Contains(t, pageRow(t, body, "orders"), "paused everywhere since "+got.PausedAt.UTC().Format("2006-01-02 15:04:05Z")+": bad deploy 4.2</span>")

			require.Equal(t, 403, f.do("POST", adminPath("orders", "resume"), "bob", "", ``, jsonCT).Code, "a reader cannot resume")
			for _, name := range []string{"orders", "plain"} {
				w = f.do("POST", adminPath(name, "resume"), "ops", "", ``, jsonCT)
				require.Equal(t, 200, w.Code, w.Body.String())
				require.Equal(t, state{Subscriber: name}, decodeJSON[state](t, w))
			}
			require.Contains(t, logs.String(), "action=resume caller=ops subscriber=orders")
			w = f.do("POST", adminPath("plain", "resume"), "ops", "", `{}`, jsonCT)
			require.Equal(t, 200, w.Code, "resuming a name that is not paused: %s", w.Body.String())
			for _, r := range replicas {
				waitCaughtUp(t, r)
			}
			for _, c := range counters {
				c.requireOnce(t, e.Events)
			}
			row := pageRow(t, f.do("GET", "/ops/", "bob", "", "", nil).Body.String(), "orders")
			require.NotContains(t, row, `class="paused"`)
			require.Contains(t, row, `action="ui/pause"`)
		})
	}
}

// pageRow is subscriber's row of the page's subscribers table, with the
// partitions table nested in it: up to the next row.
func pageRow(t *testing.T, body, subscriber string) string {
	t.Helper()
	for _, seg := range strings.Split(body, "data-subscriber=")[1:] {
		if strings.HasPrefix(seg, `"`+subscriber+`"`) {
			return seg
		}
	}
	require.Failf(t, "no row", "no row for %s in:\n%s", subscriber, body)
	return ""
}

// TestAdminPagePause drives the page's pause and resume forms as a
// browser without JavaScript would: the token, the cross-site checks and
// the authorizer guard them as the replay and discard forms; a pause
// needs its "sure" box and records the reason typed beside it; each
// success redirects to the page with its notice.
func TestAdminPagePause(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	nop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	sub := parkSubscriber(t, e, "orders", nop, subscriptions.WithPartitions(2))
	auth := &pauseAuth{}
	f := &adminFixture{mux: http.NewServeMux()}
	f.mux.Handle("/ops/", http.StripPrefix("/ops", newHandler(t, []*subscriptions.Subscriber{sub}, auth.authorize, admin.WithLogger(quietLogger()))))
	w := f.do("GET", "/ops/", "ops", "", "", nil)
	require.Equal(t, 200, w.Code)
	m := csrfField.FindStringSubmatch(pageRow(t, w.Body.String(), "orders"))
	require.NotNil(t, m, "the pause form carries a token")
	form := func(action, user string, v url.Values, hdr map[string]string) *httptest.ResponseRecorder {
		v.Set("subscriber", "orders")
		h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
		for k, x := range hdr {
			h[k] = x
		}
		return f.do("POST", "/ops/ui/"+action, user, "", v.Encode(), h)
	}
	sure := func() url.Values {
		return url.Values{"csrf": {m[1]}, "confirm": {"yes"}, "reason": {"<b>bad</b> deploy"}}
	}
	paused := func() bool {
		st, err := sub.Status(context.Background())
		require.NoError(t, err)
		return st.Paused
	}

	require.Equal(t, 403, form("pause", "ops", url.Values{"confirm": {"yes"}}, nil).Code, "no token")
	require.Equal(t, 403, form("pause", "mallory", sure(), nil).Code, "another caller's token, and a reader")
	require.Equal(t, 403, form("pause", "ops", sure(), map[string]string{"Origin": "https://evil.test"}).Code, "cross-origin")
	require.Equal(t, 403, form("pause", "ops", sure(), map[string]string{"Sec-Fetch-Site": "cross-site"}).Code, "cross-site")
	w = form("pause", "ops", url.Values{"csrf": {m[1]}, "reason": {"x"}}, nil)
	require.Equal(t, http.StatusBadRequest, w.Code, "a pause needs its confirmation box")
	require.Contains(t, w.Body.String(), "Not paused")
	require.False(t, paused(), "no refused form paused it")

	w = form("pause", "ops", sure(), map[string]string{"Origin": "http://admin.test", "Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	require.True(t, paused())
	loc, err := url.Parse(w.Header().Get("Location"))
	require.NoError(t, err)
	target := (&url.URL{Path: "/ops/ui/pause"}).ResolveReference(loc)
	w = f.do("GET", target.RequestURI(), "ops", "", "", nil)
	require.Equal(t, 200, w.Code)
	body := w.Body.String()
	require.Contains(t, body, "Paused everywhere")
	row := pageRow(t, body, "orders")
	require.Contains(t, row, ": &lt;b&gt;bad&lt;/b&gt; deploy</span>", "the reason, escaped")
	require.Regexp(t, regexp.MustCompile(`action="ui/resume">.*name="csrf" value="`+regexp.QuoteMeta(m[1])+`"`), row)

	require.Equal(t, 403, form("resume", "ops", url.Values{}, nil).Code, "no token")
	require.True(t, paused())
	w = form("resume", "ops", url.Values{"csrf": {m[1]}}, nil)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	require.False(t, paused())
	require.Contains(t, f.do("GET", "/ops/?done=resumed", "ops", "", "", nil).Body.String(), "Resumed")
	require.True(t, auth.wasAsked("pause orders"))
	require.True(t, auth.wasAsked("resume orders"))
}

// TestAdminPagePauseInBrowser (SUBSCRIPTIONS_BROWSER=1): in headless
// Chromium without JavaScript, the Pause form of a running partitioned
// subscriber cannot be sent before its "sure" box is ticked; sent with a
// reason, it pauses every partition (the replica's Status, and no event
// handled while paused) and the page shows since when and why beside a
// Resume button, which lets the replica catch up.
func TestAdminPagePauseInBrowser(t *testing.T) {
	requireBrowser(t)
	e := envBackends()[0].New(t)
	counter := &handledCounter{}
	appendN(t, e.Events, "browser.ok", 0, 6)
	replica := parkSubscriber(t, e, "orders-p", counter.handle, subscriptions.WithPartitions(3))
	start(t, replica)
	waitCaughtUp(t, replica)
	served := parkSubscriber(t, e, "orders-p", counter.handle, subscriptions.WithPartitions(3))
	h := newHandler(t, []*subscriptions.Subscriber{served}, func(*http.Request, admin.Action, string) (string, bool) {
		return "browser", true
	})
	srv := httptest.NewServer(h)
	defer srv.Close()

	ctx, text := openInBrowser(t, srv.URL+"/")
	row := `#subscribers tr[data-subscriber="orders-p"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(row+` button[name="pause"]`))))
	valid, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('`+row+` form[action="ui/pause"]').checkValidity()`))
	require.NoError(t, err)
	require.False(t, valid, "the browser does not send the form before \"sure\" is ticked")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(row+` input[name="reason"]`), "bad deploy 4.2"),
		chromedp.Click(chromedp.CSS(row+` input[name="confirm"]`)),
		chromedp.Click(chromedp.CSS(row+` button[name="pause"]`)),
		chromedp.WaitVisible(chromedp.CSS(row+` button[name="resume"]`)),
	))
	require.Contains(t, text(`p.notice`), "Paused everywhere")
	require.Regexp(t, `^paused everywhere since \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ: bad deploy 4\.2$`, text(row+` span.paused`))
	st, err := replica.Status(context.Background())
	require.NoError(t, err)
	require.True(t, st.Paused, "the running replica is paused")
	require.Equal(t, "bad deploy 4.2", st.PauseReason)
	before := counter.count()
	appendN(t, e.Events, "browser.more", 6, 6)
	require.Never(t, func() bool { return counter.count() != before }, 200*time.Millisecond, 5*time.Millisecond,
		"the replica handled an event while paused")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(row+` button[name="resume"]`)),
		chromedp.WaitVisible(chromedp.CSS(row+` button[name="pause"]`)),
	))
	require.Contains(t, text(`p.notice`), "Resumed")
	waitCaughtUp(t, replica)
	counter.requireOnce(t, e.Events)
}

// TestReadPause: the pause both surfaces answer with, read from a
// Subscriber value other than the one that paused: not paused, then since
// when and why (a checkpoint ahead of the head does not hide it); a failed
// read names the subscriber.
func TestReadPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := envBackends()[0].New(t)
	appendN(t, e.Events, "pause.ev", 0, 3)
	store := &failingStore{EventStore: e.Events}
	nop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	pauser := parkSubscriber(t, e, "orders", nop)
	reader, err := subscriptions.NewSubscriber("orders", store, e.Cps, nop)
	require.NoError(t, err)

	st, err := admin.ReadPause(ctx, reader)
	require.NoError(t, err)
	require.Equal(t, admin.PauseState{Subscriber: "orders"}, st)
	require.NoError(t, pauser.Pause(ctx, "bad deploy"))
	require.NoError(t, pauser.ResetCheckpoint(ctx, 10))
	st, err = admin.ReadPause(ctx, reader)
	require.NoError(t, err, "a checkpoint ahead of the head")
	require.True(t, st.Paused)
	require.Equal(t, "bad deploy", st.Reason)
	require.False(t, st.PausedAt.IsZero())

	store.fail.Store(true)
	_, err = admin.ReadPause(ctx, reader)
	require.ErrorContains(t, err, `read the pause of "orders"`)
	require.ErrorContains(t, err, "the database is away")
}

// TestAdminPauseUnsupported: on a checkpoint store without the pause
// capability the API answers 409 naming it, and the status still reads.
func TestAdminPauseUnsupported(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	bare := struct{ subscriptions.CheckpointStore }{e.Cps} // only the interface's methods
	sub, err := subscriptions.NewSubscriber("bare", e.Events, bare, func(context.Context, domain.EventEnvelope[any]) error { return nil })
	require.NoError(t, err)
	f := &adminFixture{mux: http.NewServeMux()}
	f.mux.Handle("/ops/", http.StripPrefix("/ops", newHandler(t, []*subscriptions.Subscriber{sub}, adminAuth, admin.WithLogger(quietLogger()))))
	for _, action := range []string{"pause", "resume"} {
		w := f.do("POST", adminPath("bare", action), "ops", "", `{}`, jsonCT)
		require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
		require.Contains(t, decodeJSON[map[string]string](t, w)["error"], "cannot pause")
	}
	w := f.do("GET", adminPath("bare"), "ops", "", "", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	require.NotContains(t, w.Body.String(), `"paused"`)
}
