// Code in this file is copied from package infrastructure (validate.go,
// already_appended.go) so that NewEventStore validates, encodes and
// recognises retries exactly as infrastructure.GormEventStore does: both
// stores append to one events table, and an append must get the same
// answer from either. This package may not import infrastructure (it is
// written on the module's exported API alone, as another team's backend
// would be); keep the two copies in step. TestValidationMatchesGorm checks
// that they give the same answers.

package pgxstore

import (
	"bytes"
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
)

// MaxIdentifierBytes bounds event IDs, aggregate IDs, event types and
// transaction IDs. Longer values are rejected with domain.ErrInvalidEvent
// rather than truncated, and the bound keeps every identifier inside what a
// Postgres B-tree index entry can hold. It is the value of
// infrastructure.MaxIdentifierBytes: both stores refuse the same
// identifiers.
const MaxIdentifierBytes = 2048

// preparedEvent is an envelope validated and completed for storage.
type preparedEvent struct {
	env      domain.EventEnvelope[any]
	payload  []byte // JSON
	metadata []byte // JSON object
}

// prepareAppend validates an Append call and completes its envelopes:
// aggregate ID filled in, sequence numbers assigned after current, Created
// defaulted to now (microsecond precision, as databases keep it), payload
// and metadata encoded as JSON. What Postgres cannot store (NUL characters)
// is refused on every store, so that every store gives the same answers.
//
// current < 0 means the aggregate's version is not known yet: everything
// but the version check and the sequence numbers' relation to the stored
// ones is validated, as a check before taking a database lock.
func prepareAppend(aggregateID string, expectedVersion, current int, events []domain.EventEnvelope[any]) ([]preparedEvent, error) {
	if err := checkIdentifier("aggregate ID", aggregateID); err != nil {
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
	out := make([]preparedEvent, 0, len(events))
	for i, ev := range events {
		where := eventRef{aggregateID, i + 1, ev.ID} // formatted only on error
		if err := checkIdentifier("event ID", ev.ID); err != nil {
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
		if err := checkIdentifier("event type", ev.EventType); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if ev.TransactionID != "" {
			if err := checkIdentifier("transaction ID", ev.TransactionID); err != nil {
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
		payload, err := encodeJSON(ev.Payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %s (type %q): payload: %v", domain.ErrInvalidEvent, where, ev.EventType, err)
		}
		if ev.Metadata == nil {
			ev.Metadata = map[string]any{}
		}
		metadata, err := encodeJSON(ev.Metadata)
		if err != nil {
			return nil, fmt.Errorf("%w: %s (type %q): metadata: %v", domain.ErrInvalidEvent, where, ev.EventType, err)
		}
		ev.Position = 0
		out = append(out, preparedEvent{env: ev, payload: payload, metadata: metadata})
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

// checkIdentifier rejects identifiers that a store could not keep exactly:
// empty, invalid UTF-8, NUL characters (Postgres text cannot hold them) or
// longer than MaxIdentifierBytes.
func checkIdentifier(what, value string) error {
	switch {
	case value == "":
		return fmt.Errorf("%w: empty %s", domain.ErrInvalidEvent, what)
	case len(value) > MaxIdentifierBytes:
		return fmt.Errorf("%w: %s is %d bytes long, at most %d are stored", domain.ErrInvalidEvent, what, len(value), MaxIdentifierBytes)
	case !utf8.ValidString(value):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", domain.ErrInvalidEvent, what, value)
	case strings.IndexByte(value, 0) >= 0:
		return fmt.Errorf("%w: %s %q contains a NUL character", domain.ErrInvalidEvent, what, value)
	}
	return nil
}

// maxChannelBytes is Postgres's identifier limit (NAMEDATALEN-1) as it
// applies to NOTIFY channels: LISTEN silently truncates a longer name
// while pg_notify refuses it (the rule of infrastructure.WithNotifyChannel
// and subscriptions.WithListenerChannel).
const maxChannelBytes = 63

// checkChannel rejects a NOTIFY channel name that LISTEN and pg_notify
// would not treat alike: empty, longer than maxChannelBytes, or with a NUL
// byte.
func checkChannel(channel string) error {
	switch {
	case channel == "":
		return fmt.Errorf("empty channel name")
	case len(channel) > maxChannelBytes:
		return fmt.Errorf("channel name %q is %d bytes, longer than Postgres's %d-byte identifier limit", channel, len(channel), maxChannelBytes)
	case strings.IndexByte(channel, 0) >= 0:
		return fmt.Errorf("channel name %q contains a NUL byte", channel)
	}
	return nil
}

// encodeJSON encodes v, refusing what JSON (or Postgres jsonb) would
// silently alter or refuse: invalid UTF-8, which encoding/json replaces with
// U+FFFD in Go strings, NUL characters and unpaired UTF-16 surrogate
// escapes, which jsonb rejects. Go strings are checked before encoding (the
// encoder would hide invalid UTF-8); the encoding itself is checked after,
// which also covers json.RawMessage and other json.Marshaler values, whose
// output the encoder copies as it is. The guarantee is an exact round trip
// or a clear error, never a quiet change. json.RawMessage is stored as its
// compacted bytes, so that numbers keep their exact digits.
func encodeJSON(v any) ([]byte, error) {
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

// checkStrings walks a Go value before it is encoded (see encodeJSON).
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

// storedEvent is what the identical-retry check compares of a stored
// event (see domain.ErrAlreadyAppended).
type storedEvent struct {
	ID            string
	AggregateID   string
	EventType     string
	TransactionID string
	SequenceNo    int
	Payload       []byte // JSON
}

// checkStoredIDs tells an append whose event IDs may already be stored
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
// events must have passed prepareAppend; payloads are their payloads as
// it encoded them (payloadsOf), in order.
func checkStoredIDs(aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], payloads [][]byte, stored map[string]storedEvent) error {
	// stored may hold other appends' events too (a coalesced batch).
	var found []storedEvent
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
			if !samePayload(payloads[i], got.Payload) {
				differs = "another payload"
			}
		}
		if differs != "" {
			return fmt.Errorf("%w: %s: an event ID is already stored, with %s", domain.ErrInvalidEvent, where, differs)
		}
	}
	return fmt.Errorf("%w: aggregate %q: the %d event(s) from ID %q (version %d) are stored exactly as given: the retry of an append that committed", domain.ErrAlreadyAppended, aggregateID, len(events), events[0].ID, firstSeq)
}

// payloadsOf is the encoded payloads of prepared events, in order.
func payloadsOf(prepared []preparedEvent) [][]byte {
	out := make([][]byte, len(prepared))
	for i, p := range prepared {
		out[i] = p.payload
	}
	return out
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
