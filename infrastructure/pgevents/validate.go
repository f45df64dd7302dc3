package pgevents

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/ident"
)

// MaxIdentifierBytes bounds event IDs, aggregate IDs, event types and
// transaction IDs. Longer values are rejected with domain.ErrInvalidEvent
// rather than truncated, and the bound keeps every identifier inside what a
// Postgres B-tree index entry can hold.
const MaxIdentifierBytes = ident.MaxBytes

// DefaultNotifyChannel is the channel on which the Postgres event stores
// NOTIFY after every committed append unless told otherwise (and the
// channel subscriptions.NewPostgresListener listens on by default), so
// that a listener of either backend is woken by appends of both.
const DefaultNotifyChannel = "pericarp_events"

// Prepared is an envelope validated and completed for storage by
// PrepareAppend. It is a plain value: safe to share once built, never
// changed by this package.
type Prepared struct {
	// Envelope is the event as it is stored: aggregate ID, sequence
	// number (when known) and Created filled in, Position zero.
	Envelope domain.EventEnvelope[any]
	Payload  []byte // JSON
	Metadata []byte // JSON object
}

// PrepareAppend validates an Append call and completes its envelopes:
// aggregate ID filled in, sequence numbers assigned after current, Created
// defaulted to now (microsecond precision, as databases keep it), payload
// and metadata encoded as JSON. What Postgres cannot store (NUL characters)
// is refused on every store, so that every store gives the same answers.
//
// current < 0 means the aggregate's version is not known yet: everything
// but the version check and the sequence numbers' relation to the stored
// ones is validated, as a check before taking a database lock.
//
// It exists so that every store of the events table refuses and encodes
// an append alike. It is safe for concurrent use; it reads events and
// never keeps or changes them.
func PrepareAppend(aggregateID string, expectedVersion, current int, events []domain.EventEnvelope[any]) ([]Prepared, error) {
	if err := CheckIdentifier("aggregate ID", aggregateID); err != nil {
		return nil, err
	}
	if expectedVersion < -1 {
		return nil, fmt.Errorf("%w: aggregate %q: expectedVersion %d (use -1 to skip the check)", domain.ErrInvalidEvent, aggregateID, expectedVersion)
	}
	if current >= 0 && expectedVersion != -1 && expectedVersion != current {
		return nil, fmt.Errorf("%w: aggregate %q is at version %d, expected %d", domain.ErrConcurrencyConflict, aggregateID, current, expectedVersion)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	seen := make(map[string]struct{}, len(events))
	out := make([]Prepared, 0, len(events))
	for i, ev := range events {
		where := eventRef{aggregateID, i + 1, ev.ID} // formatted only on error
		if err := CheckIdentifier("event ID", ev.ID); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if _, dup := seen[ev.ID]; dup {
			return nil, fmt.Errorf("%w: %s: event ID appears twice in one append", domain.ErrInvalidEvent, where)
		}
		seen[ev.ID] = struct{}{}
		if ev.AggregateID == "" {
			ev.AggregateID = aggregateID
		} else if ev.AggregateID != aggregateID {
			return nil, fmt.Errorf("%w: %s: envelope aggregate ID %q differs from the append's", domain.ErrInvalidEvent, where, ev.AggregateID)
		}
		if err := CheckIdentifier("event type", ev.EventType); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if ev.TransactionID != "" {
			if err := CheckIdentifier("transaction ID", ev.TransactionID); err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
		}
		want := current + i + 1
		switch {
		case ev.SequenceNo == 0:
			ev.SequenceNo = want
		case ev.SequenceNo < 0:
			return nil, fmt.Errorf("%w: %s: negative sequence number %d", domain.ErrInvalidEvent, where, ev.SequenceNo)
		case current < 0:
			// Checked again once the stored version is known.
		case ev.SequenceNo <= current:
			return nil, fmt.Errorf("%w: %s: sequence number %d is already stored (aggregate at version %d)", domain.ErrConcurrencyConflict, where, ev.SequenceNo, current)
		case ev.SequenceNo != want:
			return nil, fmt.Errorf("%w: %s: sequence number %d, expected %d (sequence numbers are consecutive)", domain.ErrInvalidEvent, where, ev.SequenceNo, want)
		}
		if ev.Created.IsZero() {
			ev.Created = now
		} else {
			ev.Created = ev.Created.UTC().Truncate(time.Microsecond)
			if y := ev.Created.Year(); y < 1 || y > 9999 {
				return nil, fmt.Errorf("%w: %s (type %q): created %s is outside years 1-9999 (UTC), which not every store can keep",
					domain.ErrInvalidEvent, where, ev.EventType, ev.Created.Format(time.RFC3339Nano))
			}
		}
		payload, err := EncodeJSON(ev.Payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %s (type %q): payload: %v", domain.ErrInvalidEvent, where, ev.EventType, err)
		}
		if ev.Metadata == nil {
			ev.Metadata = map[string]any{}
		}
		metadata, err := EncodeJSON(ev.Metadata)
		if err != nil {
			return nil, fmt.Errorf("%w: %s (type %q): metadata: %v", domain.ErrInvalidEvent, where, ev.EventType, err)
		}
		ev.Position = 0
		out = append(out, Prepared{Envelope: ev, Payload: payload, Metadata: metadata})
	}
	return out, nil
}

// eventRef names an event of an append in error messages. It formats
// itself only when an error is built, keeping the happy path free of
// string formatting.
type eventRef struct {
	aggregateID string
	index       int
	id          string
}

func (r eventRef) String() string {
	return fmt.Sprintf("aggregate %q, event #%d (ID %q)", r.aggregateID, r.index, r.id)
}

// CheckIdentifier rejects identifiers that a store could not keep exactly:
// empty, invalid UTF-8, NUL characters (Postgres text cannot hold them) or
// longer than MaxIdentifierBytes, with an error wrapping
// domain.ErrInvalidEvent; what names the identifier ("event ID", ...).
// The stores check their reads' arguments with it too. It is safe for
// concurrent use.
func CheckIdentifier(what, value string) error {
	if err := ident.Check(what, value); err != nil {
		return fmt.Errorf("%w: %v", domain.ErrInvalidEvent, err)
	}
	return nil
}

// CheckChannel rejects a NOTIFY channel name that LISTEN and pg_notify
// would not treat alike: empty, longer than Postgres's 63-byte identifier
// limit, or with a NUL byte. The stores and subscriptions' listener check
// with the same rule, so that any name one accepts, the others accept
// too. It is safe for concurrent use.
func CheckChannel(channel string) error { return ident.CheckChannel(channel) }

// CheckVersionRange checks the version range of a read (GetEventsRange)
// and resolves it: -1 means 1 for fromVersion and "to the end" for
// toVersion, which stays -1; other negative bounds are refused with an
// error wrapping domain.ErrInvalidEvent. It is safe for concurrent use.
func CheckVersionRange(aggregateID string, fromVersion, toVersion int) (from, to int, err error) {
	if fromVersion < -1 || toVersion < -1 {
		return 0, 0, fmt.Errorf("%w: aggregate %q: version range [%d, %d] (only -1 may be negative)", domain.ErrInvalidEvent, aggregateID, fromVersion, toVersion)
	}
	if fromVersion < 1 {
		fromVersion = 1
	}
	return fromVersion, toVersion, nil
}

// EncodeJSON encodes a payload or metadata value as the stores store it,
// refusing what JSON (or Postgres jsonb) would
// silently alter or refuse: invalid UTF-8, which encoding/json replaces with
// U+FFFD in Go strings, NUL characters and unpaired UTF-16 surrogate
// escapes, which jsonb rejects. Go strings are checked before encoding (the
// encoder would hide invalid UTF-8); the encoding itself is checked after,
// which also covers json.RawMessage and other json.Marshaler values, whose
// output the encoder copies as it is. The guarantee is an exact round trip
// or a clear error, never a quiet change. json.RawMessage is stored as its
// compacted bytes, so that numbers keep their exact digits. It is safe
// for concurrent use on a value nobody writes meanwhile.
func EncodeJSON(v any) ([]byte, error) {
	if err := checkStrings(reflect.ValueOf(v), 0, 0); err != nil {
		return nil, err
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if err := checkEncodedJSON(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkEncodedJSON checks a valid JSON text as encoding/json produced it:
// valid UTF-8, no \u0000 escape, every surrogate escape paired, nested at
// most maxJSONDepth levels, and every number within float64's range.
// Readers decode numbers as float64: a larger one (from a json.RawMessage,
// json.Number or *big.Int) would make every read covering the event fail.
func checkEncodedJSON(data []byte) error {
	if !utf8.Valid(data) {
		return fmt.Errorf("encoded JSON %q is not valid UTF-8", truncateForError(string(data)))
	}
	depth := 0
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			switch c {
			case '"':
				inString = true
			case '[', '{':
				depth++
				if depth > maxJSONDepth {
					return errTooDeep
				}
			case ']', '}':
				depth--
			case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
				end := i + 1
				for end < len(data) && strings.IndexByte("0123456789.eE+-", data[end]) >= 0 {
					end++
				}
				if err := checkJSONNumber(string(data[i:end])); err != nil {
					return err
				}
				i = end - 1
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			i++
			if i >= len(data) || data[i] != 'u' {
				continue
			}
			r, ok := hexRune(data, i+1)
			if !ok {
				return fmt.Errorf("malformed \\u escape in encoded JSON")
			}
			i += 4
			switch {
			case r == 0:
				return fmt.Errorf("a string contains a NUL character (\\u0000), which Postgres JSON cannot store")
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("a string contains an unpaired UTF-16 surrogate escape \\u%04x", r)
			case r >= 0xD800 && r <= 0xDBFF:
				low, ok := rune(0), false
				if i+2 < len(data) && data[i+1] == '\\' && data[i+2] == 'u' {
					low, ok = hexRune(data, i+3)
				}
				if !ok || low < 0xDC00 || low > 0xDFFF {
					return fmt.Errorf("a string contains an unpaired UTF-16 surrogate escape \\u%04x", r)
				}
				i += 6
			}
		}
	}
	return nil
}

// maxNumericScale is the most decimal places a Postgres numeric (and so a
// jsonb number) keeps; more fail the insert.
const maxNumericScale = 16383

// checkJSONNumber refuses a JSON number literal that a store could not
// keep or a reader could not return unchanged: beyond float64's range
// (readers decode numbers as float64, and the read would fail), non-zero
// but rounding to zero in float64 (a quiet change), or with more decimal
// places than Postgres keeps.
func checkJSONNumber(lit string) error {
	f, err := strconv.ParseFloat(lit, 64)
	if errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("number %s is beyond float64's range, and readers decode numbers as float64", truncateForError(lit))
	}
	mantissa, exponent, hasExponent := strings.Cut(strings.ToLower(lit), "e")
	if f == 0 && strings.ContainsAny(mantissa, "123456789") {
		return fmt.Errorf("number %s rounds to 0 as a float64, as readers would decode it", truncateForError(lit))
	}
	scale := 0
	if _, frac, ok := strings.Cut(mantissa, "."); ok {
		scale = len(frac)
	}
	if hasExponent {
		// Finite float64s need exponents of a few hundred; Postgres refuses
		// some zeros with huge ones (0e-20000, 0e99999999999).
		exp, err := strconv.Atoi(exponent)
		if err != nil || exp > maxNumericScale || exp < -maxNumericScale {
			return fmt.Errorf("number %s has an exponent beyond ±%d, which Postgres cannot store", truncateForError(lit), maxNumericScale)
		}
		scale -= exp
	}
	if scale > maxNumericScale {
		return fmt.Errorf("number %s has more than %d decimal places, which Postgres cannot store", truncateForError(lit), maxNumericScale)
	}
	return nil
}

// hexRune parses the four hex digits of a \u escape at data[at:].
func hexRune(data []byte, at int) (rune, bool) {
	if at+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// maxJSONDepth bounds nesting: a payload or metadata value may hold at
// most this many levels of JSON arrays and objects (the top-level one
// counts), whether it is a Go value or raw JSON. Deeper values are refused
// rather than handed to a database whose parser would fail less clearly.
const maxJSONDepth = 1000

// maxValueHops bounds the walk of a Go value through pointers and
// interfaces, which add no JSON level but could loop.
const maxValueHops = 4 * maxJSONDepth

// errTooDeep is the one message for a value nested too deep.
var errTooDeep = fmt.Errorf("nested deeper than %d levels of JSON arrays and objects", maxJSONDepth)

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// checkStrings walks a Go value before it is encoded (see EncodeJSON).
// levels counts the JSON arrays and objects around v, hops every step
// taken; both are bounded (errTooDeep).
func checkStrings(v reflect.Value, levels, hops int) error {
	if hops > maxValueHops {
		return errTooDeep
	}
	if !v.IsValid() {
		return nil
	}
	if t := v.Type(); t.Implements(jsonMarshalerType) || t.Implements(textMarshalerType) {
		return nil // the type decides its own encoding, checked once encoded
	}
	switch v.Kind() {
	case reflect.String:
		return checkJSONString(v.String())
	case reflect.Interface, reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return checkStrings(v.Elem(), levels, hops+1)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return nil // []byte encodes as base64
		}
		fallthrough
	case reflect.Array:
		if levels+1 > maxJSONDepth {
			return errTooDeep
		}
		for i := 0; i < v.Len(); i++ {
			if err := checkStrings(v.Index(i), levels+1, hops+1); err != nil {
				return err
			}
		}
	case reflect.Map:
		if levels+1 > maxJSONDepth {
			return errTooDeep
		}
		iter := v.MapRange()
		for iter.Next() {
			if iter.Key().Kind() == reflect.String {
				if err := checkJSONString(iter.Key().String()); err != nil {
					return fmt.Errorf("key: %w", err)
				}
			}
			if err := checkStrings(iter.Value(), levels+1, hops+1); err != nil {
				return err
			}
		}
	case reflect.Struct:
		// An object; an embedded struct's fields are promoted into it, so
		// the embedded struct is walked at this struct's level.
		if levels+1 > maxJSONDepth {
			return errTooDeep
		}
		t := v.Type()
		for i := 0; i < v.NumField(); i++ {
			f := t.Field(i)
			if promoted(f) {
				if err := checkStrings(v.Field(i), levels, hops+1); err != nil {
					return err
				}
				continue
			}
			if f.IsExported() {
				if err := checkStrings(v.Field(i), levels+1, hops+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// promoted reports whether encoding/json promotes f's fields into the
// enclosing object: an embedded struct (or pointer to one) without a JSON
// name.
func promoted(f reflect.StructField) bool {
	t := f.Type
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return f.Anonymous && t.Kind() == reflect.Struct && name == "" && f.Tag.Get("json") != "-"
}

func checkJSONString(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("string %q is not valid UTF-8", truncateForError(s))
	}
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("string %q contains a NUL character, which Postgres JSON cannot store", truncateForError(s))
	}
	return nil
}

func truncateForError(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
