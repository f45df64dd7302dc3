// Package domain holds the event-sourcing vocabulary that package
// subscriptions builds on: the event envelope, the EventStore contract with
// its global ordered feed (ReadAfter / HeadPosition), the store errors, and
// an EventDispatcher that routes envelopes to typed handlers by event-type
// pattern.
//
// The names mirror the documented original module so that code written
// against it compiles by changing import paths only.
package domain
