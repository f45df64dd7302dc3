package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// BrowserEnv enables TestAdminPageInBrowser; .ci/run sets it after
// installing Chromium.
const BrowserEnv = "SUBSCRIPTIONS_BROWSER"

// screenshotEnv names a file to save the page's screenshot to (the one in
// docs/ is made with it).
const screenshotEnv = "SUBSCRIPTIONS_BROWSER_SCREENSHOT"

// TestAdminPageInBrowser runs the example on Postgres with -admin and
// drives its admin page in headless Chromium, as an operator would: open
// the page, see the charts drawn from the handler's samples, pick the
// subscriber, click Replay on the parked event, and see the tables
// update.
func TestAdminPageInBrowser(t *testing.T) {
	if os.Getenv(BrowserEnv) != "1" {
		t.Skipf("set %s=1 (with chromium installed) to run the browser test", BrowserEnv)
	}
	dbtest.RequirePostgres(t)
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "%s=1 needs Debian's chromium package", BrowserEnv)

	ctx := context.Background()
	adminURL := serveExample(t, "-postgres", dbtest.PostgresDSN())

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // CI runs as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-javascript", true), // the page must work without it
		chromedp.WindowSize(1280, 720),
	)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	text := func(ctx context.Context, sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return strings.TrimSpace(v)
	}

	// The first run starts the browser, which lives as long as bctx: no
	// timeout on it (chromedp.Run's rule); the later steps have one.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(adminURL)))
	ctx2, cancel2 := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel2()
	require.NoError(t, chromedp.Do(ctx2,
		chromedp.WaitVisible(chromedp.CSS(`#subscribers tr[data-subscriber="balances"]`)),
	))
	require.Equal(t, "1", text(ctx2, `tr[data-subscriber="balances"] td.parked-count`), "the example parks one event")

	// The charts: the example's handler samples every second from before
	// the events were appended. Once the page shows a few samples (read
	// without the browser, then reloaded in it), each chart is drawn.
	samples := regexp.MustCompile(`<svg class="spark spark-lag"[^>]*data-samples="(\d+)"`)
	client := &http.Client{Timeout: time.Minute}
	t.Cleanup(client.CloseIdleConnections)
	require.Eventually(t, func() bool {
		resp, err := client.Get(adminURL)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return false
		}
		m := samples.FindSubmatch(body)
		if m == nil {
			return false
		}
		n, err := strconv.Atoi(string(m[1]))
		return err == nil && n >= 5
	}, 2*time.Minute, 100*time.Millisecond, "the page never showed 5 samples")
	require.NoError(t, chromedp.Do(ctx2, chromedp.Reload()))
	for _, kind := range []string{"lag", "lag-time", "throughput"} {
		sel := `tr[data-subscriber="balances"] svg.spark-` + kind + ` polyline`
		require.NoError(t, chromedp.Do(ctx2, chromedp.WaitVisible(chromedp.CSS(sel))), kind)
		n, err := chromedp.Run(ctx2, chromedp.Evaluate[int](`document.querySelector('`+sel+`').points.numberOfItems`))
		require.NoError(t, err, kind)
		require.GreaterOrEqual(t, n, 4, "%s: a line through the samples (the throughput's from the second)", kind)
	}
	require.Contains(t, text(ctx2, `#charts-legend`), "every 1s")
	require.NoError(t, chromedp.Do(ctx2,
		chromedp.Click(chromedp.CSS(`tr[data-subscriber="balances"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#parked button[name="replay"]`)),
	))
	row := text(ctx2, `#parked tbody tr`)
	require.Contains(t, row, "account.withdrawn")
	require.Contains(t, row, "acc-2")
	if path := os.Getenv(screenshotEnv); path != "" {
		png, err := chromedp.Run(ctx2, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, png, 0o644))
	}

	require.NoError(t, chromedp.Do(ctx2,
		chromedp.Click(chromedp.CSS(`#parked button[name="replay"]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.notice`)),
		chromedp.WaitVisible(chromedp.CSS(`#no-parked`)),
	))
	require.Contains(t, text(ctx2, `p.notice`), "Replayed")
	require.Equal(t, "0", text(ctx2, `tr[data-subscriber="balances"] td.parked-count`), "the subscribers table shows the replay")
	// Running, caught up: idle between polls, running during one.
	require.Contains(t, []string{"idle", "running"}, text(ctx2, `tr[data-subscriber="balances"] td:nth-child(2)`))
}
