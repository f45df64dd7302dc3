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

// MaxChannelBytes is Postgres's identifier limit (NAMEDATALEN-1) as it
// applies to NOTIFY channels: LISTEN silently truncates a longer name
// while pg_notify refuses it, so a longer channel could never be notified.
const MaxChannelBytes = 63

// CheckChannel rejects a NOTIFY channel name that LISTEN and pg_notify
// would not treat alike: empty, longer than MaxChannelBytes, or containing
// a NUL byte. The event store and the listener both check with it, so
// that any name one accepts, the other accepts too.
func CheckChannel(channel string) error {
	switch {
	case channel == "":
		return fmt.Errorf("empty channel name")
	case len(channel) > MaxChannelBytes:
		return fmt.Errorf("channel name %q is %d bytes, longer than Postgres's %d-byte identifier limit", channel, len(channel), MaxChannelBytes)
	case strings.IndexByte(channel, 0) >= 0:
		return fmt.Errorf("channel name %q contains a NUL byte", channel)
	}
	return nil
}
