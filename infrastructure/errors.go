package infrastructure

import "errors"

var errClosed = errors.New("infrastructure: event store is closed")
