package admin

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// coords parses a polyline's points and requires each inside the chart.
func coords(t *testing.T, points string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(points) {
		x, y, ok := strings.Cut(p, ",")
		require.True(t, ok, p)
		fx, err := strconv.ParseFloat(x, 64)
		require.NoError(t, err)
		fy, err := strconv.ParseFloat(y, 64)
		require.NoError(t, err)
		require.True(t, fx >= 0 && fx <= chartW, "x %v outside the chart", fx)
		require.True(t, fy >= chartPad && fy <= chartH-chartPad, "y %v outside the chart", fy)
		out = append(out, [2]float64{fx, fy})
	}
	return out
}

// TestHistoryKeepsOneHour: two hours of samples every 15 s leave the last
// hour's, oldest first; samples reads only those within the hour before
// the time asked.
func TestHistoryKeepsOneHour(t *testing.T) {
	t.Parallel()
	h := newHistory(15 * time.Second)
	var last time.Time
	for i := range 2 * 240 {
		last = t0.Add(time.Duration(i) * 15 * time.Second)
		h.record(key{name: "s"}, sample{at: last, ok: true, lag: int64(i)})
	}
	got := h.samples(key{name: "s"}, last)
	require.Len(t, got, 241, "an hour at 15 s, both ends included")
	require.Equal(t, last.Add(-window), got[0].at)
	require.Equal(t, last, got[len(got)-1].at)
	require.Len(t, h.series[key{name: "s"}], 241, "older samples are dropped, not only hidden")
	require.Len(t, h.samples(key{name: "s"}, last.Add(30*time.Minute)), 121, "half an hour later, half of them")
	require.Empty(t, h.samples(key{name: "other"}, last))

	// A clock that stands still keeps at most max samples.
	for range 3 * h.max {
		h.record(key{name: "still"}, sample{at: t0, ok: true})
	}
	require.Len(t, h.series[key{name: "still"}], h.max)
}

// TestBuildCharts: the three sparklines of a known series: lag and lag
// time as sampled, throughput as the handled positions' growth per minute
// between two readable samples (a reset counts 0, a failed read breaks
// the lines), scaled so that the largest value is at the top.
func TestBuildCharts(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ss := []sample{
		{at: at(0), ok: true, lag: 10, lagSeconds: 90, handled: 0},
		{at: at(30), ok: true, lag: 4, lagSeconds: 12, handled: 30}, // 30 in 30 s: 60/min
		{at: at(60), ok: true, lag: 0, lagSeconds: 0, handled: 36},  // 12/min
		{at: at(90)}, // a failed read: a gap
		{at: at(120), ok: true, lag: 2, lagSeconds: 1, handled: 40},  // no rate across the gap
		{at: at(150), ok: true, lag: 2, lagSeconds: 1.5, handled: 5}, // a reset: 0/min
	}
	c := buildCharts(ss, at(150))
	require.NotNil(t, c)

	require.Equal(t, 5, c.Lag.Samples)
	require.Equal(t, 10.0, c.Lag.Max)
	require.Equal(t, "10", c.Lag.MaxText)
	require.Equal(t, "lag (events), last 3 min: max 10, latest 2", c.Lag.Title)
	require.Len(t, c.Lag.Lines, 2, "the failed read breaks the line")
	before, after := coords(t, c.Lag.Lines[0]), coords(t, c.Lag.Lines[1])
	require.Equal(t, [][2]float64{{0, chartPad}, {24, 16.2}, {48, chartH - chartPad}}, before, "10 at the top, 4 at 40%, 0 at the bottom")
	require.Equal(t, [][2]float64{{96, 20.6}, {120, 20.6}}, after)
	require.Equal(t, "120.0", c.Lag.DotX, "the latest sample is now: the right edge")
	require.Equal(t, "20.6", c.Lag.DotY)

	require.Equal(t, 90.0, c.LagTime.Max)
	require.Equal(t, "1m30s", c.LagTime.MaxText)

	require.Equal(t, 3, c.Throughput.Samples, "a rate for each readable sample after a readable one")
	require.Equal(t, 60.0, c.Throughput.Max)
	require.Equal(t, "60/min", c.Throughput.MaxText)
	require.Equal(t, "0.0/min", c.Rate, "the reset moved the checkpoint back: nothing handled")
	require.Len(t, c.Throughput.Lines, 2)
	require.Equal(t, [][2]float64{{24, chartPad}, {48, 20.6}}, coords(t, c.Throughput.Lines[0]))
	require.Equal(t, [][2]float64{{119, chartH - chartPad}, {120, chartH - chartPad}}, coords(t, c.Throughput.Lines[1]), "one point: a dash")

	require.Nil(t, buildCharts(nil, at(0)), "no sample yet")
	one := buildCharts(ss[:1], at(0))
	require.Equal(t, "lag (events), one sample: max 10, latest 10", one.Lag.Title)
	require.Empty(t, one.Throughput.Lines, "a rate needs two samples")
	require.Equal(t, "–", one.Throughput.MaxText)
	require.Empty(t, one.Rate)
}

// TestBuildChartsMergesColumns: an hour of samples a second apart is
// drawn with at most one point per pixel column, each the column's
// largest value, so a short peak is not lost.
func TestBuildChartsMergesColumns(t *testing.T) {
	t.Parallel()
	var ss []sample
	for i := range 3600 {
		lag := int64(1)
		if i == 1234 {
			lag = 500
		}
		ss = append(ss, sample{at: t0.Add(time.Duration(i) * time.Second), ok: true, lag: lag, handled: int64(i)})
	}
	c := buildCharts(ss, ss[len(ss)-1].at)
	require.Len(t, c.Lag.Lines, 1)
	pts := coords(t, c.Lag.Lines[0])
	require.LessOrEqual(t, len(pts), chartW+1)
	require.Greater(t, len(pts), chartW/2)
	require.Equal(t, 500.0, c.Lag.Max, "the one-second peak survives the merge")
	var top int
	for _, p := range pts {
		if p[1] == chartPad {
			top++
		}
	}
	require.Equal(t, 1, top, "one column holds the peak")
	require.Equal(t, "60/min", c.Rate)
	require.Contains(t, c.Lag.Title, "last hour")
}

// TestHistoryKeep: the samples of a row no longer served (a tenant removed
// from the group) are dropped; the others stay.
func TestHistoryKeep(t *testing.T) {
	h := newHistory(15 * time.Second)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a, b := key{tenant: "t1", name: "orders"}, key{tenant: "t2", name: "orders"}
	h.record(a, sample{at: now, ok: true})
	h.record(b, sample{at: now, ok: true})
	h.keep([]key{a})
	require.Len(t, h.samples(a, now), 1)
	require.Empty(t, h.samples(b, now))
	require.NotContains(t, h.series, b)
}
