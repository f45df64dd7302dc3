package infrastructure_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// fuzzInput is one FuzzGormRoundTrip input: the payload and metadata are
// built from it by build.
type fuzzInput struct {
	leaf  string  // a string leaf, possibly invalid UTF-8 or with NULs
	key   string  // map keys
	blob  []byte  // raw JSON, []byte payloads, big integers, sizes
	kind  uint8   // leaf kind (kind % 9) and metadata mode (kind / 9 % 2)
	depth uint8   // nesting: 4 levels per unit, arrays or maps by blob bits
	num   float64 // a number leaf
}

// maxHugeString bounds the "huge string" leaf.
const maxHugeString = 2 << 20

// fuzzValue is a payload and metadata built from a fuzzInput, with what
// the store must answer for them.
type fuzzValue struct {
	payload  any
	metadata map[string]any
	// mustReject: the value cannot round-trip (invalid UTF-8, NUL,
	// non-finite number, invalid raw JSON, nesting beyond any store).
	mustReject bool
	// mayReject: the store may refuse (raw JSON whose content the builder
	// does not judge, or nesting near the documented bound).
	mayReject bool
}

func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func (in fuzzInput) build() fuzzValue {
	var v fuzzValue
	var leaf any
	switch in.kind % 9 {
	case 0:
		leaf = in.leaf
		v.mustReject = v.mustReject || !storable(in.leaf)
	case 1:
		leaf = in.num
		v.mustReject = v.mustReject || math.IsNaN(in.num) || math.IsInf(in.num, 0)
	case 2:
		leaf = in.num > 0
	case 3:
		leaf = nil
	case 4:
		reps := 1 + len(in.blob)*1024
		if len(in.leaf) > 0 && reps*len(in.leaf) > maxHugeString {
			reps = maxHugeString / len(in.leaf)
		}
		leaf = strings.Repeat(in.leaf, reps)
		v.mustReject = v.mustReject || !storable(in.leaf)
	case 5:
		leaf = in.blob // encoded as a base64 string
	case 6:
		leaf = json.RawMessage(in.blob)
		if json.Valid(in.blob) {
			v.mayReject = true
		} else {
			v.mustReject = true
		}
	case 7:
		leaf = map[string]any{in.key: in.leaf, "n": 1}
		v.mustReject = v.mustReject || !storable(in.key) || !storable(in.leaf)
	case 8:
		// Big integers: beyond float64's range (about 1024 bits) they
		// could not be read back and must be refused.
		n := new(big.Int).SetBytes(in.blob)
		if in.num < 0 {
			n.Neg(n)
		}
		leaf = n
		f, _ := new(big.Float).SetInt(n).Float64()
		v.mustReject = v.mustReject || math.IsInf(f, 0)
	}

	levels := 4 * int(in.depth)
	usesKey := false
	for i := range levels {
		bit := len(in.blob) > 0 && in.blob[(i/8)%len(in.blob)]&(1<<(i%8)) != 0
		if bit {
			leaf = map[string]any{in.key: leaf}
			usesKey = true
		} else {
			leaf = []any{leaf}
		}
	}
	if usesKey {
		v.mustReject = v.mustReject || !storable(in.key)
	}
	// Stores refuse values nested more than 1000 levels of arrays and
	// objects deep; the leaf may add a level of its own.
	switch {
	case levels > 1000:
		v.mustReject = true
	case levels >= 999:
		v.mayReject = true
	}
	v.payload = leaf

	if (in.kind/9)%2 == 1 {
		v.metadata = map[string]any{in.key: in.leaf, "blob": in.blob}
		v.mustReject = v.mustReject || !storable(in.key) || !storable(in.leaf)
	} else {
		v.metadata = map[string]any{"fixed": "value", "num": 2.5}
	}
	return v
}

// normalJSON is v as a reader sees it: its JSON decoded into any (objects
// as map[string]any, numbers as float64).
func normalJSON(t testing.TB, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// checkRoundTrip appends the input's event to a fresh aggregate of s:
// either it is refused with domain.ErrInvalidEvent and nothing is stored,
// or it reads back exactly, through every read path.
func checkRoundTrip(t testing.TB, s domain.EventStore, in fuzzInput) (accepted bool) {
	ctx := testCtx(t)
	v := in.build()
	agg := uniqueID("fuzz")
	ev := newEvent(agg, "fuzz.event", v.payload)
	ev.Metadata = v.metadata
	err := s.Append(ctx, agg, 0, ev)
	if err != nil {
		require.ErrorIs(t, err, domain.ErrInvalidEvent)
		require.True(t, v.mustReject || v.mayReject, "a storable value was refused: %v", err)
		version, err := s.GetCurrentVersion(ctx, agg)
		require.NoError(t, err)
		require.Zero(t, version, "a refused append stored nothing")
		return false
	}
	require.False(t, v.mustReject, "a value that cannot round-trip was accepted")

	got, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Len(t, got, 1)
	feed, err := s.ReadAfter(ctx, got[0].Position-1, 1)
	require.NoError(t, err, "the feed can read the event back")
	require.Equal(t, []string{ev.ID}, ids(feed))
	for _, e := range []domain.EventEnvelope[any]{got[0], feed[0]} {
		require.Equal(t, normalJSON(t, v.payload), normalJSON(t, e.Payload), "payload")
		require.Equal(t, normalJSON(t, v.metadata), normalJSON(t, e.Metadata), "metadata")
	}
	return true
}

// FuzzGormRoundTrip appends fuzz-built payloads to one SQLite memory
// store (each input on its own aggregate): no panic, and either
// ErrInvalidEvent or an exact JSON round trip. Seeds are in
// testdata/fuzz/FuzzGormRoundTrip; TestFuzzCorpusOnEveryBackend replays
// them on every store, Postgres included.
func FuzzGormRoundTrip(f *testing.F) {
	f.Add("hello", "key", []byte{}, uint8(7), uint8(0), 1.5)
	store, err := infrastructure.NewGormEventStore(dbtest.NewSQLiteMemory(f))
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, leaf, key string, blob []byte, kind, depth uint8, num float64) {
		_ = checkRoundTrip(t, store, fuzzInput{leaf: leaf, key: key, blob: blob, kind: kind, depth: depth, num: num})
	})
}

// TestFuzzCorpusOnEveryBackend replays the fuzz seed corpus on every
// store: what SQLite accepts, Postgres must accept and return alike.
func TestFuzzCorpusOnEveryBackend(t *testing.T) {
	t.Parallel() // every backend opens a store of its own
	inputs := readFuzzCorpus(t, filepath.Join("testdata", "fuzz", "FuzzGormRoundTrip"))
	// The seeds' intended outcomes, so that a mis-encoded seed cannot
	// quietly test something else. Seeds not listed may go either way.
	accept := map[string]bool{
		"object": true, "nested-arrays-maps": true, "deep-null": true, "huge-string": true,
		"raw-json": true, "raw-json-surrogate-pair": true, "raw-json-big-int": true,
		"negative-zero": true, "tiny-float": true, "bool": true, "bytes": true,
		"metadata-unicode": true, "big-int-in-range": true,
		"invalid-utf8-leaf": false, "nul-leaf": false, "too-deep": false,
		"raw-json-nul-escape": false, "raw-json-lone-surrogate": false,
		"raw-json-out-of-range": false, "raw-json-invalid": false,
		"raw-json-invalid-utf8": false, "nan": false, "metadata-invalid-key": false,
		"map-key-nul": false, "big-int-out-of-range": false,
		"raw-json-underflow": false, "raw-json-zero-huge-exponent": false,
	}
	for name := range accept {
		require.Contains(t, inputs, name, "seed file missing")
	}
	for _, b := range storeBackends() {
		t.Run(b.name, func(t *testing.T) {
			s := b.open(t)
			for name, in := range inputs {
				t.Run(name, func(t *testing.T) {
					accepted := checkRoundTrip(t, s, in)
					if want, ok := accept[name]; ok {
						require.Equal(t, want, accepted, "seed %s accepted", name)
					}
				})
			}
		})
	}
}

// readFuzzCorpus parses the "go test fuzz v1" files of dir.
func readFuzzCorpus(t testing.TB, dir string) map[string]fuzzInput {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]fuzzInput{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		require.Equal(t, "go test fuzz v1", lines[0], e.Name())
		require.Len(t, lines, 7, "%s: six arguments", e.Name())
		vals := make([]any, 6)
		for i, line := range lines[1:] {
			vals[i], err = parseFuzzValue(line)
			require.NoError(t, err, "%s line %d", e.Name(), i+2)
		}
		in := fuzzInput{}
		var ok [6]bool
		in.leaf, ok[0] = vals[0].(string)
		in.key, ok[1] = vals[1].(string)
		in.blob, ok[2] = vals[2].([]byte)
		in.kind, ok[3] = vals[3].(uint8)
		in.depth, ok[4] = vals[4].(uint8)
		in.num, ok[5] = vals[5].(float64)
		require.Equal(t, [6]bool{true, true, true, true, true, true}, ok, "%s: argument types", e.Name())
		out[e.Name()] = in
	}
	return out
}

// parseFuzzValue parses one corpus line: string("..."), []byte("..."),
// byte('.'), uint8(n), float64(x) or math.Float64frombits(0x...).
func parseFuzzValue(line string) (any, error) {
	open := strings.IndexByte(line, '(')
	if open < 0 || !strings.HasSuffix(line, ")") {
		return nil, fmt.Errorf("malformed value %q", line)
	}
	typ, arg := line[:open], line[open+1:len(line)-1]
	switch typ {
	case "string":
		return strconv.Unquote(arg)
	case "[]byte":
		s, err := strconv.Unquote(arg)
		return []byte(s), err
	case "byte", "uint8":
		if strings.HasPrefix(arg, "'") {
			s, err := strconv.Unquote(arg)
			if err != nil || len(s) == 0 {
				r, _, _, err2 := strconv.UnquoteChar(arg[1:len(arg)-1], '\'')
				return uint8(r), err2
			}
			r, _ := utf8.DecodeRuneInString(s)
			return uint8(r), nil
		}
		n, err := strconv.ParseUint(arg, 0, 8)
		return uint8(n), err
	case "float64":
		return strconv.ParseFloat(arg, 64)
	case "math.Float64frombits":
		bits, err := strconv.ParseUint(arg, 0, 64)
		return math.Float64frombits(bits), err
	}
	return nil, fmt.Errorf("unsupported type %q", typ)
}
