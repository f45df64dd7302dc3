// Package subscriptionstest holds the conformance suites of the
// interfaces a backend implements: subscriptions.CheckpointStore
// (RunCheckpointStoreSuite), subscriptions.ParkingLot (RunParkingLotSuite)
// and domain.EventStore (RunEventStoreSuite). This module runs its memory,
// SQLite and Postgres implementations through them; a backend of your own
// calls them from its tests with a harness that builds a fresh instance
// per case:
//
//	func TestMyParkingLot(t *testing.T) {
//		subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
//			Name:          "mydb",
//			New:           func(t *testing.T) subscriptions.ParkingLot { return newMyLot(t) },
//			Transactional: true,
//		})
//	}
//
// Each optional capability a backend may offer has a suite of its own,
// which skips when the store does not have it, and which the interface's
// suite also runs: for a checkpoint store RunAttemptCounterSuite,
// RunPartitionCheckpointStoreSuite, RunPauserSuite and
// RunDeliveryMarkerSuite, RunRepartitionerSuite (and CheckpointResetter's
// cases), and RunFeedSharerSuite for a store sharing
// an event store's database (FeedSharer, BatchFeedReader, FeedAcquirer);
// for an event store RunPartitionFeedSuite (PartitionFeed, FeedIndex); for
// a parking lot RunDeliveredClearerSuite (DeliveredClearer,
// PartitionDeliveredClearer, ParkedCounter), RunOrderedParkingLotSuite
// (OrderedParkingLot) and ParkingLotPurger's cases;
// for a batch's failures RunBatchFailureSuite (TxEndChecker, ResetAborter,
// FailureClassifier).
// A backend that passes them all gets every guarantee of package
// subscriptions; package subscriptions' documentation says, for each
// capability, what the run loop does with and without it.
//
// The suites state in code what the interfaces' documentation says in
// words (the model is in package subscriptions' documentation); a case
// fails with testify's require, naming the case and the backend. Each
// suite runs its cases one after another as subtests of t named
// Name/<case>; cases that race (concurrent appends, competing acquires,
// concurrent replays) start and end their own goroutines and wait with
// generous deadlines, never fixed sleeps.
//
// It is a test-support package: it imports testing and testify, and no
// database driver — the caller brings the backend.
package subscriptionstest
