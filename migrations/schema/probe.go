package schema

import (
	"fmt"
	"strconv"
	"strings"
)

// ProbeTables names one store's checkpoint and pause tables as
// CheckpointProbeQuery reads them (schema-qualified where the store's schema is not the
// connection's).
type ProbeTables struct {
	Checkpoints, Pauses string
}

// CheckpointProbeQuery is the checkpoint probe of stores
// (subscriptions.CheckpointProber) in one statement, shared by the
// module's GORM and pgx checkpoint stores so that both read the tables
// alike: for store i, the row (i,
// name, position, 0) of each checkpoint row whose name is in the list at
// the placeholder names, and (i, key, 0, 1) of each pause row whose key is
// in the list at keys. names and keys are the driver's list placeholders
// ("?" expanded by GORM into a list, or "(SELECT unnest($1::text[]))").
func CheckpointProbeQuery(stores []ProbeTables, names, keys string) string {
	var b strings.Builder
	for i, t := range stores {
		n := strconv.Itoa(i)
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT " + n + ", subscriber, position, 0 FROM " + t.Checkpoints + " WHERE subscriber IN " + names +
			" UNION ALL SELECT " + n + ", subscriber, 0, 1 FROM " + t.Pauses + " WHERE subscriber IN " + keys)
	}
	return b.String()
}

// ScanCheckpointProbe reads CheckpointProbeQuery's rows (next, scan: a driver's row cursor) for n stores
// and names, whose pause keys are keys (one each): positions[i][j] is the
// checkpoint of store i's name j (0 without a row), paused[i][j] whether
// its key has a pause row.
func ScanCheckpointProbe(n int, names, keys []string, next func() bool, scan func(dest ...any) error) (positions [][]int64, paused [][]bool, err error) {
	positions, paused = make([][]int64, n), make([][]bool, n)
	for i := range n {
		positions[i], paused[i] = make([]int64, len(names)), make([]bool, len(names))
	}
	byName := make(map[string][]int, len(names))
	byKey := make(map[string][]int, len(keys))
	for j, name := range names {
		byName[name] = append(byName[name], j)
		byKey[keys[j]] = append(byKey[keys[j]], j)
	}
	for next() {
		var (
			i, kind  int
			row      string
			position int64
		)
		if err := scan(&i, &row, &position, &kind); err != nil {
			return nil, nil, err
		}
		if i < 0 || i >= n {
			return nil, nil, fmt.Errorf("checkpoint probe: row of store %d out of range for %d stores", i, n)
		}
		if kind == 1 {
			for _, j := range byKey[row] {
				paused[i][j] = true
			}
			continue
		}
		for _, j := range byName[row] {
			positions[i][j] = position
		}
	}
	return positions, paused, nil
}
