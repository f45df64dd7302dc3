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
// subscriber's partitions are hidden until its summary is clicked, then
// each partition's row is shown.
func TestAdminPagePartitionsInBrowser(t *testing.T) {
	if os.Getenv("SUBSCRIPTIONS_BROWSER") != "1" {
		t.Skip("set SUBSCRIPTIONS_BROWSER=1 (with chromium installed) to run the browser test")
	}
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "SUBSCRIPTIONS_BROWSER=1 needs Debian's chromium package")

	e := envBackends()[0].New(t)
	appendN(t, e.Events, "browser.ok", 0, 6)
	sub := parkSubscriber(t, e, "orders-p", func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithPartitions(3))
	r := start(t, sub)
	waitCaughtUp(t, sub)
	r.stop(t)
	h, err := admin.NewHandler([]*subscriptions.Subscriber{sub}, func(*http.Request, admin.Action, string) (string, bool) {
		return "browser", true
	})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-javascript", true), // the page must work without it
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	// The first run starts the browser, which lives as long as bctx: no
	// timeout on it (chromedp.Run's rule); the later steps have one.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/")))
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return strings.TrimSpace(v)
	}

	row := `#subscribers tr[data-subscriber="orders-p"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(row+` .partition-count`))))
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
