package admin

import (
	"sync"
	"time"
)

// WithClock replaces the handler's wall clock with a test's (FakeClock).
var WithClock = withClock

// FakeClock is a clock a test moves by hand, for one handler: Now stands
// still until Advance, and the sampler's ticker ticks only on Advance. Safe
// for concurrent use.
type FakeClock struct {
	mu    sync.Mutex
	now   time.Time
	ticks chan time.Time
	ready chan struct{} // closed when the sampler made its ticker
	stop  chan struct{} // closed when it stopped it
	once  sync.Once
}

// NewFakeClock returns a FakeClock at now.
func NewFakeClock(now time.Time) *FakeClock {
	return &FakeClock{now: now, ticks: make(chan time.Time), ready: make(chan struct{}), stop: make(chan struct{})}
}

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTicker returns the clock's one ticker.
func (c *FakeClock) NewTicker(time.Duration) (<-chan time.Time, func()) {
	c.once.Do(func() { close(c.ready) })
	return c.ticks, func() { close(c.stop) }
}

// Advance moves the clock by d and delivers a tick: it returns once the
// sampler took it (its sample is then being taken, not yet recorded), or
// at once when the ticker was stopped (Close).
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	c.mu.Unlock()
	<-c.ready
	select {
	case c.ticks <- now:
	case <-c.stop:
	}
}
