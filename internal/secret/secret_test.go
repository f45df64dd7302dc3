package secret_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/secret"
)

func TestRedactDSN(t *testing.T) {
	const pw = "s3cr3t"
	for _, tc := range []struct {
		name, dsn string
		keep      []string // what the redacted DSN must still show
	}{
		{"url", "postgres://user:" + pw + "@db.example:5432/app?sslmode=disable", []string{"user", "db.example:5432/app"}},
		{"url, escaped", "postgres://user:s3%40cr3t@db/app", []string{"db/app"}},
		{"url, unescaped @", "postgres://user:s3@cr3t@db/app", []string{"db/app"}},
		{"url, password parameter", "postgres://db/app?user=u&password=" + pw, []string{"db/app"}},
		{"key=value", "host=db user=u password=" + pw + " dbname=app", []string{"host=db", "dbname=app"}},
		{"key=value, quoted", "host=db password='s3 cr\\'3t' dbname=app", []string{"dbname=app"}},
		{"sslpassword", "host=db sslpassword=" + pw, []string{"host=db"}},
		{"malformed", "postgres://po:stgres:" + pw + "@127.0.0.1:5432/test?x=%", []string{"127.0.0.1:5432"}},
		{"no password", "postgres://user@db/app", []string{"postgres://user@db/app"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := secret.RedactDSN(tc.dsn)
			for _, leaked := range []string{pw, "s3@cr3t", "s3%40cr3t", "s3 cr'3t", `s3 cr\'3t`} {
				require.NotContains(t, got, leaked)
			}
			for _, k := range tc.keep {
				require.Contains(t, got, k)
			}
		})
	}
}

func TestNormalizeLongestFirst(t *testing.T) {
	got := secret.Normalize([]string{"ab", "", "abc", "ab"})
	require.Equal(t, []string{"abc", "ab"}, got)
	require.Equal(t, "x "+secret.Mask, secret.Scrub("x abc", got), "a secret containing another is masked whole")
}
