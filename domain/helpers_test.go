package domain_test

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireNoZeroField fails when any exported field of the struct v is zero.
func requireNoZeroField(t *testing.T, v any) {
	t.Helper()
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		require.False(t, rv.Field(i).IsZero(), "field %s is zero", f.Name)
	}
}
