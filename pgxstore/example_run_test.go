package pgxstore_test

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestExample runs the package's examples against the test server and
// checks what they print.
func TestExample(t *testing.T) {
	dbtest.RequirePostgres(t)
	for _, ex := range []struct {
		name string
		run  func()
		want string
	}{
		{"Example", Example, "ada 20.00\nbob 3.00\n"},
		{"ExampleEventStore_AppendTx", ExampleEventStore_AppendTx, "<nil>\ntrue\n1 event: acc-1\n"},
		{"ExampleTxFromContext_copy", ExampleTxFromContext_copy, "3 deposits, 60.00 in all\n"},
	} {
		t.Run(ex.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			require.NoError(t, err)
			stdout := os.Stdout
			os.Stdout = w
			func() {
				defer func() { os.Stdout = stdout }()
				ex.run()
			}()
			require.NoError(t, w.Close())
			out, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Equal(t, ex.want, string(out))
		})
	}
}
