// Package watermill forwards a subscriber's feed to a message broker
// through any watermill message.Publisher.
package watermill
