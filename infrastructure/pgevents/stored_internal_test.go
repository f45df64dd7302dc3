package pgevents

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSameNumber compares JSON numbers by exact value, whatever the
// notation (jsonb writes 1e2 as 100 and keeps 1.50).
func TestSameNumber(t *testing.T) {
	cases := []struct {
		a, b string
		same bool
	}{
		{"0", "-0", true},
		{"0.000", "0e-5", true},
		{"1E+2", "100", true},
		{"12.3400e2", "1234", true},
		{"-1.50", "-15e-1", true},
		{"1e-0", "1", true},
		{"9007199254740993", "9007199254740992", false},
		{"0.1000000000000000000001", "0.1", false},
		{"-1", "1", false},
		{"1e9223372036854775807", "1e9223372036854775807", true},
		{"1e9223372036854775808", "1e9223372036854775809", false}, // exponent beyond int64: exact text only
	}
	for _, c := range cases {
		require.Equal(t, c.same, sameNumber(c.a, c.b), "%s vs %s", c.a, c.b)
		require.Equal(t, c.same, sameNumber(c.b, c.a), "%s vs %s", c.b, c.a)
	}
}
