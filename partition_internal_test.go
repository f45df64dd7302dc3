package subscriptions

import (
	"reflect"
	"testing"
)

// TestPartitionChildCopiesEveryField: partitionChild lists Subscriber's
// fields one by one (a struct copy would copy the running flag). A new
// field fails this test until partitionChild says whether a partition
// inherits it; then update the count.
func TestPartitionChildCopiesEveryField(t *testing.T) {
	if n := reflect.TypeFor[Subscriber]().NumField(); n != 25 {
		t.Fatalf("Subscriber has %d fields, partitionChild was written for 25: decide whether partitionChild copies the new ones", n)
	}
}
