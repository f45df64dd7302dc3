package pgevents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/eventfeed/subscriptions/domain"
)

// Stored is what the identical-retry check (CheckStoredIDs) compares of
// a stored event (see domain.ErrAlreadyAppended): the columns that
// SelectStored reads, in its order.
type Stored struct {
	ID            string
	AggregateID   string
	EventType     string
	TransactionID string
	SequenceNo    int
	Payload       []byte // JSON
}

// SelectStored reads the Stored columns of the events whose IDs are in
// $1 (a text[] on pgx), in the search_path's events table
// (Table.SelectStored names another).
const SelectStored = `SELECT id, aggregate_id, event_type, transaction_id, sequence_no, payload FROM events WHERE id = ANY($1)`

const selectStoredTemplate = `SELECT id, aggregate_id, event_type, transaction_id, sequence_no, payload FROM {{events}} WHERE id = ANY($1)`

// CheckStoredIDs tells an append whose event IDs may already be stored
// apart from a new one, given the stored events among its IDs: nil when
// none is stored; an error wrapping domain.ErrAlreadyAppended when every
// event is stored exactly as given (a retry of an append that committed);
// an error wrapping domain.ErrInvalidEvent when some ID is stored with
// other content or another sequence number than the call asks for
// (expectedVersion included), or only some of them are stored.
//
// Every store calls it with the events' IDs looked up where they cannot
// change under it (under its lock or write transaction), before the
// version check: a retry's expectedVersion is stale by construction.
// events must have passed PrepareAppend; prepared is what it returned for
// them, in order. It exists so that every store answers a retry alike.
// It is safe for concurrent use and changes none of its arguments.
func CheckStoredIDs(aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], prepared []Prepared, stored map[string]Stored) error {
	// stored may hold other appends' events too (a coalesced batch).
	var found []Stored
	for _, ev := range events {
		if s, ok := stored[ev.ID]; ok {
			found = append(found, s)
		}
	}
	switch {
	case len(found) == 0:
		return nil
	case len(found) < len(events):
		// Some IDs stored, some not: not the retry of one append.
		s := found[0]
		return fmt.Errorf("%w: aggregate %q: an event ID is already stored: event %q (aggregate %q, version %d), while other events of the append are new", domain.ErrInvalidEvent, aggregateID, s.ID, s.AggregateID, s.SequenceNo)
	}
	// The sequence numbers the call asks for: its own, or the ones after
	// expectedVersion; with neither (-1 and zeros), any consecutive ones.
	firstSeq := expectedVersion + 1
	for i, ev := range events {
		got := stored[ev.ID]
		where := eventRef{aggregateID, i + 1, ev.ID}
		if i == 0 && expectedVersion == -1 {
			firstSeq = got.SequenceNo
		}
		var differs string
		switch {
		case got.AggregateID != aggregateID:
			differs = fmt.Sprintf("aggregate %q", got.AggregateID)
		case ev.SequenceNo != 0 && ev.SequenceNo != got.SequenceNo,
			ev.SequenceNo == 0 && got.SequenceNo != firstSeq+i:
			differs = fmt.Sprintf("sequence number %d", got.SequenceNo)
		case got.EventType != ev.EventType:
			differs = fmt.Sprintf("event type %q", got.EventType)
		case got.TransactionID != ev.TransactionID:
			differs = fmt.Sprintf("transaction ID %q", got.TransactionID)
		default:
			if !samePayload(prepared[i].Payload, got.Payload) {
				differs = "another payload"
			}
		}
		if differs != "" {
			return fmt.Errorf("%w: %s: an event ID is already stored, with %s", domain.ErrInvalidEvent, where, differs)
		}
	}
	return fmt.Errorf("%w: aggregate %q: the %d event(s) from ID %q (version %d) are stored exactly as given: the retry of an append that committed", domain.ErrAlreadyAppended, aggregateID, len(events), events[0].ID, firstSeq)
}

// samePayload compares an encoded payload with a stored one as JSON
// values, so that a database's normalisation (jsonb reorders keys, drops
// whitespace and writes numbers its own way: 1e2 as 100, 1.50 kept) does
// not matter, while every difference in value does: numbers are compared
// by exact decimal value (sameNumber), never through float64, which
// would take 9007199254740993 for 9007199254740992.
func samePayload(given, stored []byte) bool {
	a, errA := decodeExact(given)
	b, errB := decodeExact(stored)
	return errA == nil && errB == nil && sameJSON(a, b)
}

// decodeExact decodes a JSON text keeping numbers as their text.
func decodeExact(raw []byte) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func sameJSON(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, av := range a {
			bv, ok := b[k]
			if !ok || !sameJSON(av, bv) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		return ok && sameNumber(string(a), string(b))
	default: // string, bool, nil
		return a == b
	}
}

// sameNumber compares two JSON numbers by exact value, through a
// canonical form (sign, significant digits, exponent) rather than big.Rat,
// so that a number like 1e999999999 costs nothing to compare.
func sameNumber(a, b string) bool {
	ca, okA := canonicalNumber(a)
	cb, okB := canonicalNumber(b)
	if !okA || !okB {
		return a == b
	}
	return ca == cb
}

// canonicalNumber writes a JSON number as sign, significant digits
// without leading or trailing zeros, and exponent: "-1.50e1" and "-15"
// both as "-15e0"; every zero as "0". ok is false for an exponent beyond
// int64 (then only identical texts compare equal).
func canonicalNumber(s string) (string, bool) {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	mant, exp := s, int64(0)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.ParseInt(strings.TrimPrefix(s[i+1:], "+"), 10, 64)
		if err != nil {
			return "", false
		}
		mant, exp = s[:i], e
	}
	digits := mant
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		frac := mant[i+1:]
		digits = mant[:i] + frac
		exp -= int64(len(frac))
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", true
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	return sign + trimmed + "e" + strconv.FormatInt(exp, 10), true
}
