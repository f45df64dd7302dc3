package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/eventfeed/subscriptions"
	migschema "github.com/eventfeed/subscriptions/migrations/schema"
)

// A partitioned subscriber (subscriptions.WithPartitions) keeps one
// checkpoint row per partition, NAME/partition-K-of-N, and a marker row,
// NAME/partitions, whose position holds N (-1 once repartitioned to run
// unpartitioned); its parked events are kept
// under NAME (the formats are the library's partitionName and
// partitionMarker, checkpoint_partition.go and partition.go). The CLI
// shows and addresses such a subscriber by NAME.
var partitionRow = regexp.MustCompile(`^(.+)/partition-([0-9]+)-of-([0-9]+)$`)

const markerSuffix = "/partitions"

// group is one subscriber as the CLI shows it: a plain name, or a
// partitioned one with its partition checkpoints.
type group struct {
	name string
	// partitions is N for a partitioned subscriber, 0 otherwise.
	partitions int
	// checkpoints are the positions of the partition rows of N, by
	// partition; other holds rows of another partition count (retired by
	// a repartition, or left by an earlier N; see docs/partitions.md).
	checkpoints map[int]int64
	other       []string
}

// groups lists every subscriber with a checkpoint or a parked event,
// sorted by name, the rows of a partitioned one grouped under its name.
func (d *database) groups(ctx context.Context) ([]*group, error) {
	var rows []struct {
		Subscriber string
		Position   int64
	}
	// A tenant's tables are named in its schema (Qualified: the table
	// alone without a tenant, for the search_path to select).
	err := d.db.WithContext(ctx).Raw(`SELECT subscriber, position FROM ` + migschema.Qualified(d.tenant, "subscriber_checkpoints") + `
		UNION SELECT DISTINCT subscriber, -1 FROM ` + migschema.Qualified(d.tenant, "parked_events")).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("list subscribers: %w", err)
	}
	byName := map[string]*group{}
	get := func(name string) *group {
		g := byName[name]
		if g == nil {
			g = &group{name: name, checkpoints: map[int]int64{}}
			byName[name] = g
		}
		return g
	}
	type part struct {
		name, base string
		p, n       int
		position   int64
	}
	var parts []part
	// unpartitioned: names whose marker says they were repartitioned to
	// run unpartitioned (its position is then negative).
	unpartitioned := map[string]bool{}
	for _, r := range rows {
		if base, ok := cutSuffix(r.Subscriber, markerSuffix); ok {
			get(base).partitions = int(max(r.Position, 0))
			unpartitioned[base] = r.Position < 0
			continue
		}
		if m := partitionRow.FindStringSubmatch(r.Subscriber); m != nil {
			p, perr := strconv.Atoi(m[2])
			n, nerr := strconv.Atoi(m[3])
			if perr == nil && nerr == nil && p < n {
				parts = append(parts, part{r.Subscriber, m[1], p, n, r.Position})
				get(m[1])
				continue
			}
		}
		get(r.Subscriber)
	}
	marked := map[string]bool{}
	for name, g := range byName {
		marked[name] = g.partitions > 0 || unpartitioned[name]
	}
	for _, pt := range parts {
		if g := byName[pt.base]; !marked[pt.base] {
			// No marker (a store written by hand?): the largest count seen.
			g.partitions = max(g.partitions, pt.n)
		}
	}
	for _, pt := range parts {
		g := byName[pt.base]
		if pt.n == g.partitions {
			g.checkpoints[pt.p] = pt.position
		} else {
			g.other = append(g.other, pt.name)
		}
	}
	out := make([]*group, 0, len(byName))
	for _, g := range byName {
		slices.Sort(g.other)
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *group) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	return out, nil
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return "", false
}

// findGroup returns the subscriber called name. A partition's checkpoint
// name is refused with the name to use instead.
func findGroup(groups []*group, name string) (*group, error) {
	for _, g := range groups {
		if g.name == name {
			return g, nil
		}
	}
	if m := partitionRow.FindStringSubmatch(name); m != nil {
		return nil, fmt.Errorf("%q is a checkpoint of the partitioned subscriber %q: name the subscriber, %q", name, m[1], m[1])
	}
	if base, ok := cutSuffix(name, markerSuffix); ok {
		return nil, fmt.Errorf("%q is the partition count of the partitioned subscriber %q: name the subscriber, %q", name, base, base)
	}
	return nil, fmt.Errorf("no subscriber %q in this database (status lists them)", name)
}

// partitionStatus is one partition of a partitioned subscriber: its
// checkpoint row and the events of the partition not yet handled.
type partitionStatus struct {
	Partition  int     `json:"partition"`
	Checkpoint string  `json:"checkpoint"`
	Position   int64   `json:"position"`
	Lag        int64   `json:"lag"`
	LagSeconds float64 `json:"lag_seconds"`
}

// partitionReadChunk bounds one read of the feed by partitionStatuses.
const partitionReadChunk = 1000

// partitionStatuses reads each partition's lag up to head: the feed after
// the lowest partition checkpoint is read once, and each event counted for
// its partition (subscriptions.PartitionOf) when past that partition's
// checkpoint. A partition without a row is at 0.
func (d *database) partitionStatuses(ctx context.Context, g *group, head int64) ([]partitionStatus, error) {
	out := make([]partitionStatus, g.partitions)
	from := head
	for p := range out {
		out[p] = partitionStatus{Partition: p, Checkpoint: fmt.Sprintf("%s/partition-%d-of-%d", g.name, p, g.partitions), Position: g.checkpoints[p]}
		from = min(from, out[p].Position)
	}
	now := time.Now()
	for cursor := from; cursor < head; {
		chunk, err := d.events.ReadAfter(ctx, cursor, partitionReadChunk)
		if err != nil {
			return nil, fmt.Errorf("status of %q: read the feed after position %d: %w", g.name, cursor, err)
		}
		for _, ev := range chunk {
			if ev.Position > head {
				break
			}
			ps := &out[subscriptions.PartitionOf(ev.AggregateID, g.partitions)]
			if ev.Position <= ps.Position {
				continue
			}
			if ps.Lag == 0 && !ev.Created.IsZero() {
				ps.LagSeconds = max(0, now.Sub(ev.Created).Seconds())
			}
			ps.Lag++
		}
		if len(chunk) < partitionReadChunk {
			break
		}
		cursor = chunk[len(chunk)-1].Position
	}
	return out, nil
}
