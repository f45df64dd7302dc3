package pgxstore_test

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestExample runs Example against the test server and checks what it
// prints.
func TestExample(t *testing.T) {
	dbtest.RequirePostgres(t)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = w
	func() {
		defer func() { os.Stdout = stdout }()
		Example()
	}()
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, "ada 20.00\nbob 3.00\n", string(out))
}
