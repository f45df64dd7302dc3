// Package wirecount counts what pgx connections send to Postgres: round
// trips, as seen on the wire, and statements, as pgx runs them. The
// round-trip tests of the stores and cmd/subbench's appends scenario
// count with it.
package wirecount

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Counter counts the round trips and statements of the connections
// dialled through Dial and traced by it (pgx.ConnConfig.Tracer). A round
// trip starts with a write that follows a read (or a connection's first
// write); a statement is each query pgx runs, each query of a batch
// included; a batch is each pgx batch (a pipeline: the stores send an
// append transaction as one). It is safe for concurrent use.
type Counter struct{ turns, stmts, batches atomic.Int64 }

// Dial wraps dial so that the connections it opens are counted.
func (c *Counter) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &turnConn{Conn: conn, turns: &c.turns}
		tc.read.Store(true)
		return tc, nil
	}
}

// Count runs f and returns the round trips and statements counted
// meanwhile.
func (c *Counter) Count(f func() error) (turns, stmts int64, err error) {
	t0, s0 := c.turns.Load(), c.stmts.Load()
	err = f()
	return c.turns.Load() - t0, c.stmts.Load() - s0, err
}

// Turns is the number of round trips counted so far.
func (c *Counter) Turns() int64 { return c.turns.Load() }

// Stmts is the number of statements counted so far, a batch's each.
func (c *Counter) Stmts() int64 { return c.stmts.Load() }

// Batches is the number of batches counted so far.
func (c *Counter) Batches() int64 { return c.batches.Load() }

// TraceQueryStart counts a statement (pgx.QueryTracer).
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.stmts.Add(1)
	return ctx
}

// TraceQueryEnd is part of pgx.QueryTracer.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch's statements (pgx.BatchTracer).
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.stmts.Add(int64(d.Batch.Len()))
	c.batches.Add(1)
	return ctx
}

// TraceBatchQuery is part of pgx.BatchTracer.
func (c *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd is part of pgx.BatchTracer.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// turnConn counts a connection's round trips.
type turnConn struct {
	net.Conn
	turns *atomic.Int64
	read  atomic.Bool
}

func (c *turnConn) Write(p []byte) (int, error) {
	if c.read.Swap(false) {
		c.turns.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *turnConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}
