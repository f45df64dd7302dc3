// Package secret keeps Postgres passwords out of messages: it finds every
// string in a DSN that may be a password, by syntax alone, and masks those
// strings in text. It is the one implementation used by the listener, the
// example program, cmd/subbench and the test harness.
//
// Everything here is a pure function, safe for concurrent use.
package secret

import (
	"net/url"
	"regexp"
	"sort"
	"strings"
)

// Mask replaces every secret in a message.
const Mask = "xxxxx"

var (
	// kvPassword finds password= and sslpassword= values in key=value DSNs
	// (quoted or not) and in URL query strings.
	kvPassword  = regexp.MustCompile(`(?i)(?:^|[\s?&])(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s&#]*)`)
	kvUnescaper = strings.NewReplacer(`\'`, `'`, `\\`, `\`)
)

// FromDSN returns every string in dsn that may be a password, including
// their unescaped forms, longest first. It works on DSNs too malformed for
// a driver to parse, and over-approximates on purpose: masking a harmless
// string costs readability, missing a password leaks it.
func FromDSN(dsn string) []string {
	var out []string
	add := func(s string) {
		out = append(out, s)
		if u, err := url.PathUnescape(s); err == nil {
			out = append(out, u)
		}
		if u, err := url.QueryUnescape(s); err == nil {
			out = append(out, u)
		}
	}
	// URL userinfo: the password runs from a ':' to an '@'. A malformed DSN
	// may have several of each (an unescaped '@' or ':' in the password, a
	// mistyped scheme), so every such span is a candidate, except the one
	// starting at the scheme's "://".
	for i := range len(dsn) {
		if dsn[i] != '@' {
			continue
		}
		for j := range i {
			if dsn[j] == ':' && !strings.HasPrefix(dsn[j+1:i], "//") {
				add(dsn[j+1 : i])
			}
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		v := m[1]
		if strings.HasPrefix(v, "'") {
			v = strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'")
			out = append(out, v, kvUnescaper.Replace(v))
			continue
		}
		add(v)
	}
	return Normalize(out)
}

// Normalize drops empty strings and duplicates and sorts longest first, so
// that a secret containing another is masked whole. Use it after adding a
// password learnt elsewhere (PGPASSWORD, a .pgpass file) to FromDSN's list.
func Normalize(secrets []string) []string {
	seen := make(map[string]bool, len(secrets))
	out := secrets[:0:0]
	for _, s := range secrets {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// Scrub replaces every secret in msg with Mask. secrets must come from
// FromDSN or Normalize (longest first).
func Scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, Mask)
	}
	return msg
}

// RedactDSN returns dsn with every possible password masked, for messages
// that name the server (URL or key=value form, parseable or not).
func RedactDSN(dsn string) string {
	return Scrub(dsn, FromDSN(dsn))
}
