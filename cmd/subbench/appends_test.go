package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInsertValues: the shared VALUES builder writes the statement text
// the hand-written appends sent before it existed (numbered placeholders
// across rows, jsonb values cast), so the measured statements are the same.
func TestInsertValues(t *testing.T) {
	sql, args := insertValues("INSERT INTO t (a, b, c) VALUES ", [][]any{
		{"x", jsonb(`{"n":1}`), 7},
		{"y", jsonb(`{}`), 8},
	})
	require.Equal(t, "INSERT INTO t (a, b, c) VALUES ($1, $2::jsonb, $3), ($4, $5::jsonb, $6)", sql)
	require.Equal(t, []any{"x", `{"n":1}`, 7, "y", `{}`, 8}, args)
}
