// Package ident checks identifiers (event IDs, aggregate IDs, event types,
// transaction IDs, subscriber names) before they reach a database, so that
// every store keeps them exactly or refuses them with a clear error,
// never truncating or altering them.
package ident

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxBytes bounds identifiers: it keeps every one inside what a Postgres
// B-tree index entry can hold.
const MaxBytes = 2048

// Check rejects an identifier that is empty, longer than MaxBytes, not
// valid UTF-8, or contains a NUL character (Postgres text cannot hold
// one). what names the identifier in the message ("event ID", ...).
func Check(what, value string) error {
	switch {
	case value == "":
		return fmt.Errorf("empty %s", what)
	case len(value) > MaxBytes:
		return fmt.Errorf("%s is %d bytes long, at most %d are stored", what, len(value), MaxBytes)
	case !utf8.ValidString(value):
		return fmt.Errorf("%s %q is not valid UTF-8", what, value)
	case strings.IndexByte(value, 0) >= 0:
		return fmt.Errorf("%s %q contains a NUL character", what, value)
	}
	return nil
}
