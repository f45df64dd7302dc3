package subscriptions

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestPartitionChildCopiesEveryField: partitionChild lists Subscriber's
// fields one by one (a struct copy would copy the running flag). A new
// field fails this test until partitionChild says whether a partition
// inherits it; then update the count.
func TestPartitionChildCopiesEveryField(t *testing.T) {
	if n := reflect.TypeFor[Subscriber]().NumField(); n != 27 {
		t.Fatalf("Subscriber has %d fields, partitionChild was written for 27: decide whether partitionChild copies the new ones", n)
	}
}

// TestPartitionOfMatchesSQL: the Go hash and the SQL filter assign every
// aggregate ID the same partition (ASCII, UTF-8, empty, long IDs), so the
// coordinator's probe marks the partition whose read will return the event.
func TestPartitionOfMatchesSQL(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	ids := []string{"", "acc-1", "ünïcödé-äggregate", "日本語", strings.Repeat("x", 1000)}
	for i := range 200 {
		ids = append(ids, fmt.Sprintf("agg-%d", i), uuid.NewString())
	}
	for _, n := range []int{1, 3, 8, 16, 1024} {
		for _, id := range ids {
			var got int
			if err := pg.DB.Raw("SELECT mod("+partitionHashSQL+", ?) FROM (SELECT ?::text AS aggregate_id) AS e", n, id).Scan(&got).Error; err != nil {
				t.Fatal(err)
			}
			if want := PartitionOf(id, n); got != want {
				t.Fatalf("aggregate %q, %d partitions: SQL says %d, Go %d", id, n, got, want)
			}
		}
	}
}
