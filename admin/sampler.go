package admin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/eventfeed/subscriptions"
)

// The page's charts are drawn from samples the handler takes itself: no
// metrics backend, no script. A goroutine of the handler's (started by
// NewHandler, ended by Close) reads each subscriber's Status every sample
// interval and keeps the last hour of lag and handled positions in memory;
// the page draws them (chart.go).

// window is how much history the charts keep and show.
const window = time.Hour

// defaultSampleInterval is WithSampleInterval's default; minSampleInterval
// its floor.
const (
	defaultSampleInterval = 15 * time.Second
	minSampleInterval     = 100 * time.Millisecond
)

// WithSampleInterval sets how often the handler samples each subscriber's
// Status for the page's charts (default 15 s, also for 0; at least
// 100 ms). Each sample is one Status call per subscriber (three or four
// indexed statements); the handler keeps an hour of them in memory, 3600 s
// / d per subscriber (240 by default).
func WithSampleInterval(d time.Duration) Option {
	return func(c *config) { c.sampleEvery = d }
}

// clock is the sampler's time: the wall clock, or a test's.
type clock interface {
	Now() time.Time
	// NewTicker returns a channel that delivers a time every d and a
	// function that stops it.
	NewTicker(d time.Duration) (<-chan time.Time, func())
}

// wallClock is the clock of a handler outside tests.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// withClock replaces the wall clock (tests: see export_test.go).
func withClock(c clock) Option {
	return func(cfg *config) { cfg.clock = c }
}

// sample is one reading of a subscriber's Status. ok false is a read that
// failed: a gap in the charts.
type sample struct {
	at         time.Time
	ok         bool
	lag        int64
	lagSeconds float64
	// handled is Head − Lag: the positions behind the checkpoints (for an
	// unpartitioned subscriber its checkpoint; for a partitioned one the
	// head less the events the partitions have left). Its growth between
	// two samples is the events handled in between, on a feed whose
	// positions are dense (this module's stores).
	handled int64
}

// history is the samples of every row (subscriber, and tenant), oldest
// first, each kept for window. It is safe for concurrent use: the sampler
// records while pages read, under mu.
type history struct {
	mu     sync.Mutex
	max    int // samples kept per row at most
	series map[key][]sample
}

func newHistory(every time.Duration) *history {
	return &history{max: int(window/every) + 2, series: map[key][]sample{}}
}

// keep drops the samples of every row but keys: a tenant removed from the
// group takes its history with it.
func (h *history) keep(keys []key) {
	live := make(map[key]bool, len(keys))
	for _, k := range keys {
		live[k] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.series {
		if !live[k] {
			delete(h.series, k)
		}
	}
}

// record appends s to name's samples and drops those older than window
// before it (and the oldest beyond max, should the clock stand still).
func (h *history) record(name key, s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := append(h.series[name], s)
	drop := 0
	for drop < len(ss) && ss[drop].at.Before(s.at.Add(-window)) {
		drop++
	}
	drop = max(drop, len(ss)-h.max)
	if drop > 0 {
		ss = append(ss[:0], ss[drop:]...)
	}
	h.series[name] = ss
}

// samples returns a copy of name's samples taken within window before now.
func (h *history) samples(name key, now time.Time) []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []sample
	for _, s := range h.series[name] {
		if !s.at.Before(now.Add(-window)) && !s.at.After(now) {
			out = append(out, s)
		}
	}
	return out
}

// chartSpan is how far back the charts go at now: from the sampler's
// start, at most window ("" before a second's worth).
func (h *Handler) chartSpan(now time.Time) string {
	if d := now.Sub(h.sampler.started); d >= time.Second {
		return spanLabel(min(d, window))
	}
	return ""
}

// sampler owns the handler's sampling goroutine: NewHandler starts it,
// Close cancels its context and waits for it to return.
type sampler struct {
	started time.Time // the clock's time at the start
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine returned
	once    sync.Once
}

// startSampler starts h's sampling goroutine: a sample of every subscriber
// at once, then one every interval, until Close.
func (h *Handler) startSampler() {
	ctx, cancel := context.WithCancel(context.Background())
	h.sampler = &sampler{started: h.cfg.clock.Now(), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.sampler.done)
		tick, stop := h.cfg.clock.NewTicker(h.cfg.sampleEvery)
		defer stop()
		for {
			h.sampleAll(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick:
			}
		}
	}()
}

// sampleAll records one sample of each row (of the tenants the source has
// now), one Status call at a time, each bounded by the interval so that a
// database that hangs does not pile the samples up (the timed-out read is
// a gap).
func (h *Handler) sampleAll(ctx context.Context) {
	keys := h.src.keys()
	h.history.keep(keys)
	for _, name := range keys {
		sub, ref := h.src.lookup(name)
		if ref != nil {
			continue // removed since keys
		}
		rctx, cancel := context.WithTimeout(ctx, h.cfg.sampleEvery)
		st, err := sub.Status(rctx)
		cancel()
		if ctx.Err() != nil {
			return // Close: not a gap, the end
		}
		s := sample{at: h.cfg.clock.Now()}
		if err == nil {
			s = sampleOf(s.at, st)
		} else {
			h.cfg.logger.Debug("admin sampler: status read failed", append(name.logAttrs(), "error", err)...)
		}
		h.history.record(name, s)
	}
}

// Close stops the handler's sampler, the goroutine NewHandler started for
// the page's charts, and waits for it to return (an in-flight Status read
// is cancelled). The handler still serves after Close; its charts only
// stop growing. Close is idempotent and safe for concurrent use. Call it
// when the handler is no longer served: the goroutine has no other end,
// and a handler never closed keeps it, and its samples, for the life of
// the process (it owns no other resource).
func (h *Handler) Close() {
	h.sampler.once.Do(h.sampler.cancel)
	<-h.sampler.done
}

// validateSampling checks WithSampleInterval and fills the defaults.
func (c *config) validateSampling() error {
	if c.clock == nil {
		c.clock = wallClock{}
	}
	if c.sampleEvery == 0 {
		c.sampleEvery = defaultSampleInterval
	}
	if c.sampleEvery < minSampleInterval {
		return fmt.Errorf("WithSampleInterval: %v is below %v (each sample reads every subscriber's Status)", c.sampleEvery, minSampleInterval)
	}
	return nil
}

// sampleOf is the sample of a Status read at at.
func sampleOf(at time.Time, st subscriptions.Status) sample {
	return sample{at: at, ok: true, lag: st.Lag, lagSeconds: st.LagSeconds, handled: st.Head - st.Lag}
}
