package main

import "time"

// sizes are the scenario sizes of a mode.
type sizes struct {
	memEvents, memWindow, memReps int

	dbEvents int

	latencyAppends, latencyWarmup int
	latencySpacing                time.Duration
	unrelatedHold                 time.Duration

	replicaEvents, replicaSlices int

	idleSubscribers int
	idleInterval    time.Duration
	idleDuration    time.Duration

	appendDuration time.Duration
	appendRounds   int
	appendWriters  []int
	// The multi-process variant: processes x writers each, rounds.
	appendProcs, appendProcWriters, appendProcRounds int

	partitionEvents, partitionSlow int
	batchEvents                    int
	orderedEvents                  int
	feedEvents                     int
}

func (b *bench) sizes() sizes {
	if b.cfg.Quick {
		return sizes{
			memEvents: 20_000, memWindow: 5_000, memReps: 1,
			dbEvents:       1_000,
			latencyAppends: 30, latencyWarmup: 5, latencySpacing: 2 * time.Millisecond, unrelatedHold: 2 * time.Second,
			replicaEvents: 500, replicaSlices: 1,
			idleSubscribers: 10, idleInterval: 100 * time.Millisecond, idleDuration: 500 * time.Millisecond,
			appendDuration: 100 * time.Millisecond, appendRounds: 2, appendWriters: []int{1, 4, 16},
			appendProcs: 2, appendProcWriters: 2, appendProcRounds: 1,
			partitionEvents: 400, partitionSlow: 200, batchEvents: 1_000, orderedEvents: 2_000, feedEvents: 3_000,
		}
	}
	return sizes{
		memEvents: 1_000_000, memWindow: 100_000, memReps: 11,
		dbEvents:       50_000,
		latencyAppends: 1_000, latencyWarmup: 20, latencySpacing: 3 * time.Millisecond, unrelatedHold: 2 * time.Second,
		replicaEvents: 20_000, replicaSlices: 4,
		idleSubscribers: 100, idleInterval: 100 * time.Millisecond, idleDuration: 10 * time.Second,
		appendDuration: 1500 * time.Millisecond, appendRounds: 2, appendWriters: []int{1, 4, 16},
		appendProcs: 4, appendProcWriters: 4, appendProcRounds: 2,
		partitionEvents: 20_000, partitionSlow: 4_000, batchEvents: 100_000, orderedEvents: 20_000, feedEvents: 20_000,
	}
}
