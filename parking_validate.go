package subscriptions

import (
	"fmt"

	"github.com/eventfeed/subscriptions/internal/ident"
)

// ValidateParked reports why no parking lot could keep p exactly: its
// subscriber name or event ID is empty, longer than MaxSubscriberNameBytes,
// not valid UTF-8 or contains a NUL character; nil otherwise. Every lot of
// this module refuses such an entry before parking it, and a lot of another
// backend calls ValidateParked to refuse exactly what they refuse. The
// message names the entry and carries no package prefix, for the caller
// to add its own. It is a pure function, safe for concurrent use.
func ValidateParked(p ParkedEvent) error {
	if err := validateName(p.Subscriber); err != nil {
		return fmt.Errorf("park event %q: %w", p.EventID, err)
	}
	if err := ident.Check("event ID", p.EventID); err != nil {
		return fmt.Errorf("park for %q: %w", p.Subscriber, err)
	}
	return nil
}
