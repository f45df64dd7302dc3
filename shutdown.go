package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

var (
	// ErrHandlerTimeout is the cause (context.Cause) of a handler context
	// whose WithHandlerTimeout deadline passed, and is wrapped by the
	// handler failure the subscriber logs and parks.
	ErrHandlerTimeout = errors.New("handler timed out (WithHandlerTimeout)")

	// ErrShutdownGrace is the cause (context.Cause) of a handler context
	// cancelled because the WithShutdownGrace period after Run's
	// cancellation ran out.
	ErrShutdownGrace = errors.New("shutdown grace period expired (WithShutdownGrace)")
)

// drainContext returns the context batches run handlers on: it ignores
// ctx's cancellation, so that shutdown drains the batch in flight, unless
// a shutdown grace is set, in which case it is cancelled that long after
// ctx is. stop ends the goroutine that watches ctx; Run calls it before
// returning.
func (s *Subscriber) drainContext(ctx context.Context) (drain context.Context, stop func()) {
	drain = context.WithoutCancel(ctx)
	if s.shutdownGrace <= 0 {
		return drain, func() {}
	}
	drain, cancel := context.WithCancelCause(drain)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		grace := time.NewTimer(s.shutdownGrace)
		defer grace.Stop()
		select {
		case <-done:
		case <-grace.C:
			cancel(ErrShutdownGrace)
		}
	}()
	return drain, func() {
		close(done)
		<-ended
		cancel(nil)
	}
}

// handle runs the handler for one event with the per-event timeout.
// stopped reports that the shutdown grace ran out during the call: the
// caller rolls the batch back and stops, instead of retrying or parking
// an event that did not fail on its own. That holds whatever the handler
// returned: a handler that returns nil after its context was cancelled may
// have skipped its work, and the handlers after it would run on a
// cancelled context, so the batch must not commit.
func (r *runner) handle(hctx context.Context, ev domain.EventEnvelope[any]) (stopped bool, err error) {
	s := r.s
	if r.graceExpired() { // expired during an earlier handler: do not start this one
		return true, ErrShutdownGrace
	}
	ctx := hctx
	if s.handlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(hctx, s.handlerTimeout, ErrHandlerTimeout)
		defer cancel()
	}
	err = s.handler(ctx, ev)
	if r.graceExpired() {
		s.logger.Warn("subscriber: shutdown grace period expired; the batch is rolled back and delivered again after a restart",
			append(s.eventAttrs(ev), "grace", s.shutdownGrace, "error", err)...)
		if err == nil {
			err = ErrShutdownGrace
		}
		return true, err
	}
	if err == nil {
		return false, nil
	}
	if context.Cause(ctx) == ErrHandlerTimeout && !errors.Is(err, ErrHandlerTimeout) {
		err = fmt.Errorf("%w after %v: %w", ErrHandlerTimeout, s.handlerTimeout, err)
	}
	return false, err
}

// graceExpired reports whether the shutdown grace ran out: the batch in
// flight must roll back, whatever its handlers returned. The run loop
// checks it after every handler call and again before every commit.
func (r *runner) graceExpired() bool {
	return context.Cause(r.drain) == ErrShutdownGrace
}
