package ctxsleep_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/eventfeed/subscriptions/internal/ctxsleep"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSleep(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want bool
	}{
		{"the delay passes", context.Background(), time.Millisecond, true},
		{"zero delay, live context", context.Background(), 0, true},
		{"negative delay, live context", context.Background(), -time.Second, true},
		{"cancelled before a long delay", cancelled, time.Hour, false},
		{"zero delay, cancelled context", cancelled, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, ctxsleep.Sleep(tt.ctx, tt.d))
		})
	}
}

// TestSleepEndsWhenContextEnds: a context cancelled during the wait ends
// it (the hour-long delay would otherwise hang the test until its deadline).
func TestSleepEndsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan bool, 1)
	go func() { result <- ctxsleep.Sleep(ctx, time.Hour) }()
	cancel()
	select {
	case got := <-result:
		require.False(t, got)
	case <-time.After(30 * time.Second):
		t.Fatal("Sleep did not return after its context was cancelled")
	}
}
