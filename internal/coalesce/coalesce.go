// Package coalesce holds the switch that turns append coalescing off in
// this process, so that cmd/subbench can measure the append without it
// (the design before coalescing) beside the default in the same run. It
// is not an application setting: the coalesced append has the same
// guarantees. It is not faster in every workload: `go -C cmd/subbench
// run . -only appends` measures both.
package coalesce

import "sync/atomic"

// Disabled makes every GormEventStore of this process append alone: each
// Postgres append its own transaction, lock and commit.
var Disabled atomic.Bool

// FixedInFlight makes every GormEventStore of this process keep two
// append transactions in flight whether or not other processes append to
// its table (the design before the adaptive limit), so that cmd/subbench
// can measure the limit beside it.
var FixedInFlight atomic.Bool
