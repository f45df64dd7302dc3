package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/internal/pgxconn"
)

// ErrNoBatchTx is wrapped by CopyFrom's error outside a handler's batch
// transaction (a MemoryCheckpointStore's batch, or no batch at all):
// nothing was written.
var ErrNoBatchTx = errors.New("no batch transaction in the context (TxFromContext is nil)")

// CopyFrom writes rows into table through the batch transaction ctx
// carries (TxFromContext), the bulk write of a batch handler
// (WithBatchHandler) that rebuilds a projection: like every write through
// TxFromContext, the rows commit with the checkpoint advance, or vanish
// with it when the batch rolls back, so each event's rows are written
// exactly once. columns name table's columns; each row of rows holds
// their values in order (pgx.CopyFromRows, pgx.CopyFromSlice). It returns
// the number of rows written.
//
// On Postgres through pgx's database/sql driver (gorm.io/driver/postgres's
// default), in a batch of a GormCheckpointStore, it is Postgres's COPY:
// pgx's CopyFrom on the connection the batch transaction runs on, inside
// that transaction, which it first checks is open (a transaction a
// statement ended or left failed is refused: nothing is written outside
// it). Elsewhere — on SQLite, on another driver, in the transaction of a
// GormParkingLot's Replay or of a reset's apply function, which are not a
// batch's — it writes the same rows with multi-row INSERTs in the same
// transaction, so a handler that copies runs everywhere, only slower.
// Outside a database-backed transaction it returns an error wrapping
// ErrNoBatchTx.
//
// rows is read while the COPY runs: it must not use the batch
// transaction itself. Like the transaction, CopyFrom belongs to the
// handler's goroutine; call it only until the handler returns. A failed
// COPY leaves the transaction failed on Postgres: return its error from
// the handler, which discards the attempt's writes.
func CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	v, _ := ctx.Value(txContextKey{}).(*batchTx)
	if v == nil || v.tx == nil {
		return 0, fmt.Errorf("subscriptions: copy into %s: %w", table.Sanitize(), ErrNoBatchTx)
	}
	if len(columns) == 0 {
		return 0, fmt.Errorf("subscriptions: copy into %s: no columns", table.Sanitize())
	}
	if v.conn != nil && v.tx.Name() == "postgres" {
		var (
			n       int64
			viaCopy bool
		)
		err := v.conn.Raw(func(dc any) error {
			pc, ok := pgxconn.Unwrap(dc)
			if !ok {
				return nil // another driver: INSERTs below
			}
			viaCopy = true
			// 'T': in a transaction that stands. Outside one (a statement
			// ended it) the COPY would commit on its own; in a failed one
			// it would fail anyway.
			switch status := pc.PgConn().TxStatus(); status {
			case 'T':
			case 'I':
				return ErrBatchTxEnded
			default:
				return fmt.Errorf("the batch transaction has failed (status %q): return the statement's error from the handler", status)
			}
			var err error
			n, err = pc.CopyFrom(ctx, table, columns, rows)
			return err
		})
		if viaCopy {
			if err != nil {
				return n, fmt.Errorf("subscriptions: copy into %s: %w", table.Sanitize(), err)
			}
			return n, nil
		}
		if err != nil {
			return 0, fmt.Errorf("subscriptions: copy into %s: %w", table.Sanitize(), err)
		}
	}
	n, err := insertRows(ctx, v, table, columns, rows)
	if err != nil {
		return n, fmt.Errorf("subscriptions: copy into %s (as INSERTs): %w", table.Sanitize(), err)
	}
	return n, nil
}

// copyInsertParams bounds the bind parameters of one of insertRows'
// statements, under SQLite's default limit (32766) and Postgres's
// (65535).
const copyInsertParams = 30_000

// insertRows is CopyFrom where COPY is not available: rows as multi-row
// INSERTs through the transaction's handle (the handler's view of it, so
// that on SQLite a statement that ended the transaction is noticed as for
// any handler write), with the driver's placeholders.
func insertRows(ctx context.Context, v *batchTx, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	exec := v.tx.Statement.ConnPool
	numbered := v.tx.Name() == "postgres"
	quoted := make([]string, len(columns))
	for i, c := range columns {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	head := "INSERT INTO " + table.Sanitize() + " (" + strings.Join(quoted, ", ") + ") VALUES "
	perStatement := max(1, copyInsertParams/len(columns))
	var (
		total int64
		sb    strings.Builder
		args  []any
	)
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		res, err := exec.ExecContext(ctx, sb.String(), args...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		total += n
		sb.Reset()
		args = args[:0]
		return nil
	}
	for rows.Next() {
		values, err := rows.Values()
		if err != nil {
			return total, err
		}
		if len(values) != len(columns) {
			return total, fmt.Errorf("a row has %d values for %d columns", len(values), len(columns))
		}
		if len(args) == 0 {
			sb.WriteString(head)
		} else {
			sb.WriteString(", ")
		}
		sb.WriteByte('(')
		for i, val := range values {
			if i > 0 {
				sb.WriteString(", ")
			}
			args = append(args, val)
			if numbered {
				sb.WriteString("$" + strconv.Itoa(len(args)))
			} else {
				sb.WriteByte('?')
			}
		}
		sb.WriteByte(')')
		if len(args)/len(columns) >= perStatement {
			if err := flush(); err != nil {
				return total, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return total, err
	}
	return total, flush()
}
