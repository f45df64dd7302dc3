//go:build race

package subscriptions_test

// faultRace reports whether the test binary runs under the race detector:
// the crash child is then built with -race too, so that it reuses the
// race-instrumented packages the test build already compiled (and any race
// in the library shows up in the children's output).
const faultRace = true
