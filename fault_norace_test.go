//go:build !race

package subscriptions_test

// faultRace reports whether the test binary runs under the race detector
// (see fault_race_test.go).
const faultRace = false
