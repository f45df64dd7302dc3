package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serveExample runs the example in-process with -admin on a free loopback
// port and returns the admin page's URL once it serves; the example is
// stopped (as by Ctrl-C) when the test ends, and must then exit 0.
func serveExample(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	exited := make(chan int, 1)
	errs := &lockedBuffer{}
	go func() {
		code := run(ctx, append(args, "-admin", "127.0.0.1:0"), pw, errs)
		pw.Close()
		exited <- code
	}()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long for the scanner
	}()
	t.Cleanup(func() {
		cancel()
		for range lines {
		}
		require.Equal(t, 0, <-exited, "the example's exit status; stderr:\n%s", errs.String())
	})
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the example exited early:\n%s", errs.String())
			if rest, ok := strings.CutPrefix(line, "admin: "); ok && strings.HasPrefix(rest, "http://") {
				adminURL, _, _ := strings.Cut(rest, " ")
				go func() { // keep draining the example's output
					for range lines {
					}
				}()
				return adminURL
			}
		case <-deadline:
			t.Fatalf("the example did not serve the admin page within 2 minutes:\n%s", errs.String())
		}
	}
}

// TestAdminFlag: with -admin the example serves the admin API under
// /admin/ to loopback clients, with the parked event left to replay.
func TestAdminFlag(t *testing.T) {
	base := serveExample(t)
	client := &http.Client{Timeout: time.Minute}
	t.Cleanup(client.CloseIdleConnections) // no transport goroutine outlives the test
	get := func(path string, v any) {
		t.Helper()
		resp, err := client.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}
	var page struct {
		Events []struct {
			EventID   string `json:"event_id"`
			EventType string `json:"event_type"`
		}
	}
	get("api/subscribers/balances/parked", &page)
	require.Len(t, page.Events, 1)
	require.Equal(t, typeWithdrawn, page.Events[0].EventType)

	replay := base + "api/subscribers/balances/parked/" + url.PathEscape(page.Events[0].EventID) + "/replay"
	resp, err := client.Post(replay, "text/plain", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode, "not JSON: refused")
	resp, err = client.Post(replay, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the handler was fixed: the replay succeeds")

	var status struct {
		Subscribers []struct {
			Subscriber string
			Parked     int
			Lag        int64
		}
	}
	get("api/subscribers", &status)
	require.Len(t, status.Subscribers, 1)
	require.Zero(t, status.Subscribers[0].Parked)
	require.Zero(t, status.Subscribers[0].Lag)
}

// lockedBuffer collects output written by the example's goroutine while
// the test may read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
