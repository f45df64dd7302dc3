package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
)

// TestAdminPagePartitionsInBrowser opens the admin page in headless
// Chromium with JavaScript disabled (SUBSCRIPTIONS_BROWSER=1, as
// examples/projection's browser test): a caught-up partitioned
// subscriber's charts are drawn (lag and throughput from three samples),
// its partitions are hidden until its summary is clicked, then each
// partition's row is shown.
func TestAdminPagePartitionsInBrowser(t *testing.T) {
	requireBrowser(t)
	e := envBackends()[0].New(t)
	appendN(t, e.Events, "browser.ok", 0, 6)
	sub := parkSubscriber(t, e, "orders-p", func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithPartitions(3))
	r := start(t, sub)
	waitCaughtUp(t, sub)
	r.stop(t)
	// Three samples, taken on a clock the test moves: caught up, 3 events
	// behind, caught up again by a reset to the head (3 events in 15 s).
	clock := admin.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	h := newHandler(t, []*subscriptions.Subscriber{sub}, func(*http.Request, admin.Action, string) (string, bool) {
		return "browser", true
	}, admin.WithClock(clock), admin.WithSampleInterval(15*time.Second))
	srv := httptest.NewServer(h)
	defer srv.Close()
	samples := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://admin.test/", nil))
			return sparks(t, w.Body.String())["lag"].samples == n
		}, 30*time.Second, time.Millisecond, "the page never showed %d samples", n)
	}
	samples(1)
	appendN(t, e.Events, "browser.more", 6, 3)
	clock.Advance(15 * time.Second)
	samples(2)
	head, err := sub.Head(context.Background())
	require.NoError(t, err)
	require.NoError(t, sub.ResetCheckpoint(context.Background(), head))
	clock.Advance(15 * time.Second)
	samples(3)

	ctx, text := openInBrowser(t, srv.URL+"/")
	row := `#subscribers tr[data-subscriber="orders-p"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(row+` .partition-count`))))

	// The charts: each drawn at its size, the lag's line through the three
	// samples, the throughput's latest rate beside its chart.
	for _, kind := range []string{"lag", "lag-time", "throughput"} {
		sel := row + ` svg.spark-` + kind
		require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel))), kind)
		size, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](fmt.Sprintf(`(() => { const r = document.querySelector('%s').getBoundingClientRect(); return [r.width, r.height]; })()`, sel)))
		require.NoError(t, err, kind)
		require.Equal(t, []float64{120, 28}, size, "%s chart's size", kind)
	}
	points, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelector('`+row+` svg.spark-lag polyline').points.numberOfItems`))
	require.NoError(t, err)
	require.Equal(t, 3, points, "the lag chart's line joins the three samples")
	lineBox, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => { const r = document.querySelector('`+row+` svg.spark-lag polyline').getBoundingClientRect(); return [r.width, r.height]; })()`))
	require.NoError(t, err)
	require.Greater(t, lineBox[0], 100.0, "the line spans the chart: %v", lineBox)
	require.Greater(t, lineBox[1], 10.0, "and rises to the peak of 3: %v", lineBox)
	require.Equal(t, "12/min", text(row+` td.throughput .value`))
	require.Equal(t, "max 3", text(row+` td.lag .spark-max`))
	require.Equal(t, "3", text(row+` .partition-count`))
	// Not shown until asked. checkVisibility, not the rows' geometry: a
	// closed details element hides its content with content-visibility,
	// which leaves the rows their boxes.
	shown := func(p int) bool {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector('%s tr[data-partition="%d"]').checkVisibility()`, row, p)))
		require.NoError(t, err)
		return v
	}
	for p := range 3 {
		require.False(t, shown(p), "caught up: partition %d is shown on demand only", p)
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row+` summary`))))
	for p := range 3 {
		require.True(t, shown(p), "partition %d, once the summary was clicked", p)
	}
	require.Equal(t, "stopped", text(row+` tr[data-partition="1"] td:nth-child(2)`))
	require.Equal(t, "0", text(row+` tr[data-partition="1"] td:nth-child(4)`))
}

// requireBrowser skips the test unless SUBSCRIPTIONS_BROWSER=1, and then
// requires chromium.
func requireBrowser(t *testing.T) {
	t.Helper()
	if os.Getenv("SUBSCRIPTIONS_BROWSER") != "1" {
		t.Skip("set SUBSCRIPTIONS_BROWSER=1 (with chromium installed) to run the browser test")
	}
	_, err := exec.LookPath("chromium")
	require.NoError(t, err, "SUBSCRIPTIONS_BROWSER=1 needs Debian's chromium package")
}

// openInBrowser opens url in headless Chromium with JavaScript disabled
// (the page must work without it), until the test's cleanup. It returns
// the context of the steps (two minutes for them all) and text, the
// trimmed text of the first element matching a CSS selector.
func openInBrowser(t *testing.T, url string) (context.Context, func(sel string) string) {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-javascript", true),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	// The first run starts the browser, which lives as long as bctx: no
	// timeout on it (chromedp.Run's rule); the later steps have one.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(url)))
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx, func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return strings.TrimSpace(v)
	}
}

// TestAdminPageTenantsInBrowser opens a Group's admin page in headless
// Chromium with JavaScript disabled (SUBSCRIPTIONS_BROWSER=1): every row
// shows its tenant; the filter box narrows the table to one tenant; a
// row's link selects that tenant's subscriber, and its Pause form pauses
// that tenant's subscriber only.
func TestAdminPageTenantsInBrowser(t *testing.T) {
	requireBrowser(t)
	f := newGroupFixture(t, envBackends()[0])
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("X-User", "browser") // the fixture's authorizer
		f.handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	ctx, text := openInBrowser(t, srv.URL+"/")
	rows := func() []string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#subscribers tr[data-subscriber]')).map(r => r.querySelector('td.tenant').textContent + '/' + r.dataset.subscriber)`))
		require.NoError(t, err)
		return v
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#tenant-filter input[name="tenant"]`))))
	require.Equal(t, []string{"t1/orders", "t1/emails", "t2/orders", "t2/emails"}, rows())

	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`#tenant-filter input[name="tenant"]`), "t2")))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#tenant-filter button`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#tenant-filter a[href="./"]`))))
	require.Equal(t, []string{"t2/orders", "t2/emails"}, rows())

	row := `#subscribers tr[data-subscriber="orders"][data-tenant="t2"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row+` td:nth-child(2) a`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#no-parked`))))
	require.Equal(t, "Parked events of orders (tenant t2)", text(`h2`))

	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(row+` input[name="reason"]`), "browser pause")))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row+` input[name="confirm"]`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(row+` button[name="pause"]`))))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`p.notice`))))
	require.Contains(t, text(row+` .paused`), "browser pause")
	for tenant, want := range map[string]bool{"t1": false, "t2": true} {
		st, err := f.sub(t, tenant, "orders").Status(context.Background())
		require.NoError(t, err)
		require.Equal(t, want, st.Paused, "tenant %s", tenant)
	}
}
