package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/watermill/internal/brokertest"
)

// TestExample runs the example on SQLite and on Postgres against the real
// NATS server: each order's two events are printed, placed before paid.
func TestExample(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			s := brokertest.NewStream(t, 0) // the example updates it to its own config
			dsn := ""
			if backend == "postgres" {
				dsn = dbtest.NewPostgres(t).DSN
			}
			var out bytes.Buffer
			require.NoError(t, run(context.Background(), &out, dsn, brokertest.NATSURL(), s.Name, s.Subject, 3, false))
			lines := regexp.MustCompile(`(?m)^order\.(placed|paid) (order-\d+-\d) #(\d) \{"id":"order-\d+-\d","total":\d+\}$`).FindAllStringSubmatch(out.String(), -1)
			require.Len(t, lines, 6, out.String())
			next := map[string]string{}
			for _, l := range lines {
				want := map[string]string{"": "placed 1", "placed 1": "paid 2"}[next[l[2]]]
				require.Equal(t, want, l[1]+" "+l[3], "order %s:\n%s", l[2], out.String())
				next[l[2]] = l[1] + " " + l[3]
			}
			t.Logf("\n%s", out.String())
		})
	}
}
