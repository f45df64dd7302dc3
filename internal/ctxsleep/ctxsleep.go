// Package ctxsleep is the one context-aware sleep of the module: the
// subscriber's retry backoff, the Postgres listener's reconnect delay and
// cmd/subbench's paced loops all wait through it, so that a cancelled
// context ends every wait at once and no timer outlives it.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d unless ctx ends first; it reports whether the full delay
// passed (false: ctx ended). The timer is stopped either way. A d of zero
// or less returns true at once unless ctx has already ended. Safe for
// concurrent use; it holds nothing after it returns.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
