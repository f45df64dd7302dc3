package subscriptions

import "github.com/eventfeed/subscriptions/infrastructure"

// checkFeed is the tenant NewGroup builds each definition for, on memory
// stores, to report a definition's mistakes before any Add.
func checkFeed() Feed {
	return Feed{
		Tenant:      "check",
		Events:      infrastructure.NewMemoryStore(),
		Checkpoints: NewMemoryCheckpointStore(),
		Parking:     NewMemoryParkingLot(),
	}
}
