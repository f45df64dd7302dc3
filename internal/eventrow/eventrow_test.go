package eventrow

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStoreDBWithoutRegistration(t *testing.T) {
	_, ok := StoreDB(nil)
	require.False(t, ok)
}
