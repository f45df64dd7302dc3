package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// sample is one Status reading during the catch-up.
type sample struct {
	at         time.Duration
	lag        int64
	lagSeconds float64
}

// plotCatchUp draws what the lag gauges show while a subscriber catches up
// on a backlog: ten minutes of events (6,000, one every 100 ms, as if the
// subscriber had been down that long) while new events keep arriving (one
// every 5 ms). The handler takes about 300 µs per event, like a projection
// that does some I/O. Status is sampled every 20 ms; the SVG has the lag
// in events above and the lag in seconds below.
func plotCatchUp(ctx context.Context, path string) error {
	db, cleanup, err := openDatabase()
	if err != nil {
		return err
	}
	defer cleanup()
	store, checkpoints, lot, err := openStores(db)
	if err != nil {
		return err
	}
	const backlog, spacing = 6000, 100 * time.Millisecond
	origin := time.Now().Add(-backlog * spacing)
	for first := 0; first < backlog; first += 100 {
		evs := make([]domain.EventEnvelope[any], 100)
		for i := range evs {
			evs[i] = domain.NewEventEnvelope[any](map[string]any{"n": first + i}, fmt.Sprintf("backlog-%d", first), "order.placed", i+1)
			evs[i].Created = origin.Add(time.Duration(first+i) * spacing)
		}
		if err := store.Append(ctx, evs[0].AggregateID, 0, evs...); err != nil {
			return err
		}
	}

	slow := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		time.Sleep(300 * time.Microsecond)
		return handler(ctx, ev)
	}
	sub, err := subscriptions.NewSubscriber("order-counts", store, checkpoints, slow,
		subscriptions.WithParkingLot(lot), subscriptions.WithPollInterval(50*time.Millisecond))
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() { errs <- sub.Run(runCtx) })
	wg.Go(func() { // the live trickle
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-runCtx.Done():
				errs <- nil
				return
			case <-tick.C:
			}
			if err := appendOrder(runCtx, store, i*20); err != nil && runCtx.Err() == nil {
				errs <- err
				return
			}
		}
	})

	start := time.Now()
	var samples []sample
	var caughtUp time.Time
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := sub.Status(ctx)
		if err != nil {
			stop()
			wg.Wait()
			return err
		}
		now := time.Since(start)
		samples = append(samples, sample{at: now, lag: st.Lag, lagSeconds: st.LagSeconds})
		if st.Lag <= 2 && caughtUp.IsZero() {
			caughtUp = time.Now()
		}
		if !caughtUp.IsZero() && time.Since(caughtUp) > time.Second || now > 2*time.Minute {
			break
		}
		select {
		case <-ctx.Done():
			stop()
			wg.Wait()
			return ctx.Err()
		case <-tick.C:
		}
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	if caughtUp.IsZero() {
		return fmt.Errorf("the subscriber did not catch up within two minutes")
	}
	if err := os.WriteFile(path, []byte(lagSVG(samples)), 0o644); err != nil {
		return err
	}
	fmt.Printf("caught up on %d backlog events in %s; %d samples drawn into %s\n", backlog, caughtUp.Sub(start).Round(10*time.Millisecond), len(samples), path)
	return nil
}

// lagSVG draws the samples: two panels sharing the time axis.
func lagSVG(samples []sample) string {
	const w, panelH, left, right, top, gap = 720.0, 150.0, 70.0, 20.0, 30.0, 60.0
	maxT := samples[len(samples)-1].at.Seconds()
	var maxLag, maxSec float64
	for _, s := range samples {
		maxLag = math.Max(maxLag, float64(s.lag))
		maxSec = math.Max(maxSec, s.lagSeconds)
	}
	var b strings.Builder
	h := top + 2*panelH + gap + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14">Catch-up on a 10-minute backlog (6,000 events) while new ones arrive; Status every 20 ms</text>`+"\n", left)
	panel := func(y0 float64, title, color string, maxV float64, value func(sample) float64) {
		maxV = niceCeil(maxV * 1.15)
		x := func(t float64) float64 { return left + (w-left-right)*t/maxT }
		y := func(v float64) float64 { return y0 + panelH - panelH*v/maxV }
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, y0, w-left-right, panelH)
		for i := 0; i <= 4; i++ {
			v := maxV * float64(i) / 4
			fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, w-right, y(v), y(v))
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, trimFloat(v))
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`+"\n", left+8, y0+16, color, title)
		var pts []string
		for _, s := range samples {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at.Seconds()), y(value(s))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
	}
	panel(top, "subscriptions.lag.events", "#1f77b4", maxLag, func(s sample) float64 { return float64(s.lag) })
	panel(top+panelH+gap, "subscriptions.lag.age (seconds: age of the oldest unhandled event)", "#d62728", maxSec, func(s sample) float64 { return s.lagSeconds })
	axisY := top + 2*panelH + gap
	for i := 0; i <= 5; i++ {
		t := maxT * float64(i) / 5
		xx := left + (w-left-right)*float64(i)/5
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.1f s</text>`+"\n", xx, axisY+16, t)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">time since the subscriber started</text>`+"\n", left+(w-left-right)/2, axisY+34)
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 1.5, 2, 3, 4, 5, 6 or 8 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 3, 4, 5, 6, 8, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
