package admin

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts' geometry, in SVG user units (CSS pixels at the page's
// size): a sparkline chartW wide and chartH high, its values between
// chartPad from the top and chartPad from the bottom (page.html's "spark"
// template has the same numbers: its viewBox, and its axis at the bottom).
const (
	chartW   = 120
	chartH   = 28
	chartPad = 3
)

// charts are one subscriber's three sparklines, drawn from its samples.
type charts struct {
	Lag, LagTime, Throughput sparkline
	// Throughput's latest value, for the table's cell ("" before the
	// second sample: a rate needs two).
	Rate string
}

// sparkline is one chart as the page's template draws it: the polylines
// (one per run of samples without a failed read between them) of a value
// over time, the latest value as a dot, and the figures its label and
// title give. Its coordinates are formatted numbers, safe in attributes.
type sparkline struct {
	Kind    string   // "lag", "lag-time", "throughput": the svg's class
	Lines   []string // polyline points: "x,y x,y …"
	DotX    string   // the latest value's point ("" when there is none)
	DotY    string
	Samples int     // the points the chart was drawn from
	Max     float64 // the largest value, at the top of the chart (0: flat at the bottom)
	MaxText string  // Max as the label shows it
	Title   string  // what a screen reader and a tooltip say
}

// point is one value of a series at a time; gap marks a failed read
// before it (the line breaks there).
type point struct {
	at  time.Time
	v   float64
	gap bool
}

// buildCharts draws a subscriber's samples ss as the page shows them at
// now: the x axis runs from the oldest sample kept (at most window ago)
// to now, so a sampler that stopped shows as a line that ends before the
// right edge. nil when there is no sample yet.
func buildCharts(ss []sample, now time.Time) *charts {
	if len(ss) == 0 {
		return nil
	}
	var lag, lagTime, rate []point
	// A failed read breaks the lines: the lags' at the next readable
	// sample, the rate's at the next rate (which needs two readable
	// samples in a row).
	lagGap, rateGap := false, false
	for i, s := range ss {
		if !s.ok {
			lagGap, rateGap = true, true
			continue
		}
		lag = append(lag, point{s.at, float64(s.lag), lagGap})
		lagTime = append(lagTime, point{s.at, s.lagSeconds, lagGap})
		lagGap = false
		if i == 0 || !ss[i-1].ok {
			continue
		}
		if dt := s.at.Sub(ss[i-1].at); dt > 0 {
			// A reset moves the checkpoint back: nothing was handled,
			// not a negative number of events.
			moved := max(0, s.handled-ss[i-1].handled)
			rate = append(rate, point{s.at, float64(moved) / dt.Minutes(), rateGap})
			rateGap = false
		}
	}
	from := ss[0].at
	span := now.Sub(from)
	label := spanLabel(span)
	c := &charts{
		Lag:        draw("lag", lag, from, span, formatCount, "lag (events), "+label),
		LagTime:    draw("lag-time", lagTime, from, span, formatSeconds, "lag (time), "+label),
		Throughput: draw("throughput", rate, from, span, formatRate, "throughput (events handled per minute), "+label),
	}
	if len(rate) > 0 {
		c.Rate = formatRate(rate[len(rate)-1].v)
	}
	return c
}

// draw lays pts out over [from, from+span] and [0, their max]. Points
// that fall in one pixel column are merged into their largest value (an
// operator looks for the peaks), so an hour of samples at a short
// interval is still at most chartW points a line.
func draw(kind string, pts []point, from time.Time, span time.Duration, format func(float64) string, what string) sparkline {
	sl := sparkline{Kind: kind, Samples: len(pts)}
	if len(pts) == 0 {
		sl.MaxText = "–"
		sl.Title = what + ": no value yet"
		return sl
	}
	x := func(at time.Time) int {
		if span <= 0 {
			return chartW
		}
		return int(math.Round(float64(at.Sub(from)) / float64(span) * chartW))
	}
	type col struct {
		x   int
		v   float64
		gap bool
	}
	var cols []col
	for _, p := range pts {
		cx := min(max(x(p.at), 0), chartW)
		if n := len(cols); n > 0 && cols[n-1].x == cx && !p.gap {
			cols[n-1].v = max(cols[n-1].v, p.v)
			continue
		}
		cols = append(cols, col{cx, p.v, p.gap})
	}
	for _, c := range cols {
		sl.Max = max(sl.Max, c.v)
	}
	y := func(v float64) float64 {
		if sl.Max <= 0 {
			return chartH - chartPad
		}
		return chartH - chartPad - v/sl.Max*(chartH-2*chartPad)
	}
	// Each run of columns without a gap is a polyline; a run of one is
	// drawn as a short dash, since a polyline of one point draws nothing.
	for start := 0; start < len(cols); {
		end := start + 1
		for end < len(cols) && !cols[end].gap {
			end++
		}
		run := cols[start:end]
		if len(run) == 1 {
			c := run[0]
			run = []col{{x: max(c.x-1, 0), v: c.v}, {x: min(c.x+1, chartW), v: c.v}}
		}
		xy := make([]string, len(run))
		for i, c := range run {
			xy[i] = num(float64(c.x)) + "," + num(y(c.v))
		}
		sl.Lines = append(sl.Lines, strings.Join(xy, " "))
		start = end
	}
	last := cols[len(cols)-1]
	sl.DotX, sl.DotY = num(float64(last.x)), num(y(last.v))
	sl.MaxText = format(sl.Max)
	sl.Title = what + ": max " + format(sl.Max) + ", latest " + format(pts[len(pts)-1].v)
	return sl
}

// num formats a coordinate.
func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

func formatCount(v float64) string { return strconv.FormatInt(int64(math.Round(v)), 10) }

// formatSeconds is a lag in seconds as the page shows it.
func formatSeconds(s float64) string {
	if s <= 0 {
		return "0s"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func formatRate(v float64) string {
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 1, 64) + "/min"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + "/min"
}

// spanLabel says how far back a chart goes.
func spanLabel(d time.Duration) string {
	switch {
	case d >= window-time.Minute:
		return "last hour"
	case d >= time.Minute:
		return "last " + strconv.Itoa(int(d.Round(time.Minute)/time.Minute)) + " min"
	case d >= time.Second:
		return "last " + strconv.Itoa(int(d.Round(time.Second)/time.Second)) + " s"
	}
	return "one sample"
}
