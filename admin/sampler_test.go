package admin_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
)

// appendAged appends n events created age ago.
func appendAged(t *testing.T, store domain.EventStore, n int, age time.Duration) {
	t.Helper()
	for i := range n {
		ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, "acc-1", "sample.ev", 0)
		ev.Created = time.Now().Add(-age)
		require.NoError(t, store.Append(context.Background(), ev.AggregateID, -1, ev))
	}
}

// spark is one sparkline of a page: its svg element.
type spark struct {
	samples int
	max     float64
	title   string
	lines   []string
	svg     string
}

var (
	sparkRE    = regexp.MustCompile(`<svg class="spark spark-([a-z-]+)"[^>]*data-samples="(\d+)" data-max="([^"]+)"><title>([^<]*)</title>.*?</svg>`)
	polylineRE = regexp.MustCompile(`<polyline points="([^"]*)"/>`)
)

// sparks returns the page's sparklines by kind (one subscriber's page).
func sparks(t *testing.T, body string) map[string]spark {
	t.Helper()
	out := map[string]spark{}
	for _, m := range sparkRE.FindAllStringSubmatch(body, -1) {
		n, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		mx, err := strconv.ParseFloat(m[3], 64)
		require.NoError(t, err, m[0])
		s := spark{samples: n, max: mx, title: m[4], svg: m[0]}
		for _, l := range polylineRE.FindAllStringSubmatch(m[0], -1) {
			s.lines = append(s.lines, l[1])
		}
		out[m[1]] = s
	}
	return out
}

// requireInChart requires every point of the polylines inside the
// 120x28 chart.
func requireInChart(t *testing.T, s spark) int {
	t.Helper()
	n := 0
	for _, l := range s.lines {
		for _, p := range strings.Fields(l) {
			x, y, ok := strings.Cut(p, ",")
			require.True(t, ok, p)
			fx, err := strconv.ParseFloat(x, 64)
			require.NoError(t, err)
			fy, err := strconv.ParseFloat(y, 64)
			require.NoError(t, err)
			require.True(t, fx >= 0 && fx <= 120 && fy >= 0 && fy <= 28, "point %s outside the chart: %s", p, s.svg)
			n++
		}
	}
	return n
}

// TestSamplerDrawsTheCharts: the handler samples its subscribers when it
// starts and at each tick of its clock (a test's, moved by hand), and the
// page draws the samples: lag in events and in time as read, throughput
// as the checkpoint's movement per minute between two samples.
func TestSamplerDrawsTheCharts(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	ctx := context.Background()
	appendAged(t, e.Events, 4, 90*time.Second)
	sub := parkSubscriber(t, e, "orders", func(context.Context, domain.EventEnvelope[any]) error { return nil })
	clock := admin.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	h := newHandler(t, []*subscriptions.Subscriber{sub}, adminAuth, admin.WithClock(clock), admin.WithSampleInterval(30*time.Second))
	page := func() string {
		t.Helper()
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "http://admin.test/", nil)
		r.Header.Set("X-User", "alice")
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		return w.Body.String()
	}
	waitSamples := func(n int) map[string]spark {
		t.Helper()
		var got map[string]spark
		require.Eventually(t, func() bool {
			got = sparks(t, page())
			return got["lag"].samples == n
		}, 30*time.Second, time.Millisecond, "the page never showed %d samples", n)
		return got
	}

	// The sample NewHandler's goroutine takes at once: lag 4, no rate yet.
	got := waitSamples(1)
	require.Len(t, got, 3, "lag, lag time and throughput")
	require.Equal(t, 4.0, got["lag"].max)
	require.GreaterOrEqual(t, got["lag-time"].max, 90.0, "the oldest event waits since 90 s ago")
	require.Equal(t, 0, got["throughput"].samples)
	require.Contains(t, got["lag"].title, "one sample")
	require.Contains(t, page(), "Charts: one sample so far of lag and throughput")

	// 6 more events, and the checkpoint moves 6 positions in 30 s: 12/min.
	appendAged(t, e.Events, 6, 0)
	require.NoError(t, sub.ResetCheckpoint(ctx, 6))
	clock.Advance(30 * time.Second)
	waitSamples(2)
	// Then the last 4 in the next 30 s: 8/min, caught up.
	require.NoError(t, sub.ResetCheckpoint(ctx, 10))
	clock.Advance(30 * time.Second)
	got = waitSamples(3)

	body := page()
	require.NotContains(t, body, "<script", "drawn on the server")
	require.Contains(t, body, "Charts: the last 1 min of lag and throughput", "the legend says how far back they go")
	require.Contains(t, body, "samples of each subscriber every 30s")
	lag := got["lag"]
	require.Equal(t, 4.0, lag.max)
	require.Equal(t, "lag (events), last 1 min: max 4, latest 0", lag.title)
	require.Len(t, lag.lines, 1)
	require.Equal(t, 3, requireInChart(t, lag))
	require.Equal(t, "0.0,3.0 60.0,3.0 120.0,25.0", lag.lines[0], "4, 4, 0 over the minute: top, top, bottom")
	require.Contains(t, lag.svg, `<circle cx="120.0" cy="25.0" r="2"/>`, "the latest sample, at the right edge")
	require.Equal(t, 0.0, latestSeconds(got["lag-time"]), "caught up: no age")

	tp := got["throughput"]
	require.Equal(t, 2, tp.samples)
	require.Equal(t, 12.0, tp.max)
	require.Equal(t, "throughput (events handled per minute), last 1 min: max 12/min, latest 8.0/min", tp.title)
	require.Equal(t, 2, requireInChart(t, tp))
	require.Regexp(t, `<td class="num chart throughput"><span class="value">8.0/min</span><svg`, body)
	require.Contains(t, body, `<span class="value">0</span><svg class="spark spark-lag"`, "the lag now, above its chart")
}

// latestSeconds is the latest value in the title of a lag-time chart.
func latestSeconds(s spark) float64 {
	_, latest, _ := strings.Cut(s.title, "latest ")
	d, err := time.ParseDuration(latest)
	if err != nil {
		return -1
	}
	return d.Seconds()
}

// TestSamplerGapAndClose: a failed read is a gap, not a zero; Close stops
// the sampler (no goroutine left, a tick after it changes nothing) and may
// be called again; the handler still serves.
func TestSamplerGapAndClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := envBackends()[0].New(t)
	appendAged(t, e.Events, 2, 0)
	store := &failingStore{EventStore: e.Events}
	sub, err := subscriptions.NewSubscriber("flaky", store, e.Cps, func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)
	clock := admin.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	h, err := admin.NewHandler([]*subscriptions.Subscriber{sub}, adminAuth, admin.WithClock(clock), admin.WithLogger(quietLogger()))
	require.NoError(t, err)
	page := func() map[string]spark {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "http://admin.test/", nil)
		r.Header.Set("X-User", "alice")
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code)
		return sparks(t, w.Body.String())
	}
	require.Eventually(t, func() bool { return page()["lag"].samples == 1 }, 30*time.Second, time.Millisecond)
	store.fail.Store(true)
	clock.Advance(15 * time.Second)
	require.Eventually(t, func() bool { return store.failed.Load() > 0 }, 30*time.Second, time.Millisecond, "the sample read the feed head")
	store.fail.Store(false)
	clock.Advance(15 * time.Second) // taken once the failed sample is recorded
	var got map[string]spark
	require.Eventually(t, func() bool { got = page(); return got["lag"].samples == 2 }, 30*time.Second, time.Millisecond)
	require.Len(t, got["lag"].lines, 2, "the failed read between the two samples breaks the line: %s", got["lag"].svg)
	require.Equal(t, 0, got["throughput"].samples, "no rate across a failed read")

	h.Close()
	h.Close()
	// Both return at once, the ticker being stopped (were the sampler
	// still running, the second would return only once it recorded the
	// first's sample).
	clock.Advance(15 * time.Second)
	clock.Advance(15 * time.Second)
	require.Equal(t, 2, page()["lag"].samples, "no sample after Close")
}

// failingStore fails HeadPosition while fail is set, counting the failures.
type failingStore struct {
	domain.EventStore
	fail   atomic.Bool
	failed atomic.Int64
}

func (s *failingStore) HeadPosition(ctx context.Context) (int64, error) {
	if s.fail.Load() {
		s.failed.Add(1)
		return 0, errors.New("head: the database is away")
	}
	return s.EventStore.HeadPosition(ctx)
}
