package main

import (
	"context"
	"os"
	"os/exec"
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
// the page, pick the subscriber, click Replay on the parked event, and
// see the tables update.
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
