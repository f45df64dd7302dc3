package pgevents

import (
	"fmt"
	"strconv"
	"strings"
)

// HeadsQuery is the one statement that reads the feed heads of the events
// tables named qualified (schema-qualified and quoted, as
// EventsTableQuery returns them), all on one database: one row per table,
// (its index in qualified, COALESCE(MAX(position), 0)), each an index
// lookup. It is the probe a subscriptions.Group runs instead of one head
// read per tenant (subscriptions.HeadProber).
func HeadsQuery(qualified []string) string {
	var b strings.Builder
	for i, table := range qualified {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT ")
		b.WriteString(strconv.Itoa(i))
		b.WriteString(", COALESCE(MAX(position), 0) FROM ")
		b.WriteString(table)
	}
	return b.String()
}

// ScanHeads reads HeadsQuery's rows (next, scan: a driver's row cursor)
// into one head per table, by index; n is the number of tables.
func ScanHeads(n int, next func() bool, scan func(dest ...any) error) ([]int64, error) {
	heads := make([]int64, n)
	seen := 0
	for next() {
		var i int
		var head int64
		if err := scan(&i, &head); err != nil {
			return nil, err
		}
		if i < 0 || i >= n {
			return nil, fmt.Errorf("heads probe: row index %d out of range for %d tables", i, n)
		}
		heads[i] = head
		seen++
	}
	if seen != n {
		return nil, fmt.Errorf("heads probe: %d rows for %d tables", seen, n)
	}
	return heads, nil
}
