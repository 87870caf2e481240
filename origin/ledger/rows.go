package ledger

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
)

// chunkSizes are the row counts multi-row statements are prepared for. A
// batch is cut greedily into these sizes, so every shape needs at most five
// prepared statements and SQLite never re-parses a statement per batch.
var chunkSizes = []int{256, 64, 16, 4, 1}

// chunks cuts n rows into chunkSizes.
func chunks(n int) []int {
	var out []int
	for _, size := range chunkSizes {
		for n >= size {
			out = append(out, size)
			n -= size
		}
	}
	return out
}

// rowShape is a multi-row statement: head, then one row template per row,
// then conflict and, when rows are wanted back, returning. Parameters are
// plain ?s, so every row carries all of its own arguments: the driver looks
// up each parameter's name, and with numbered ones SQLite finds a name by
// walking the list of them, which is quadratic in a 256-row statement.
type rowShape struct {
	name      string
	head      string
	row       string
	perRow    int
	conflict  string
	returning string
}

func (s rowShape) sql(rows int, returning bool) string {
	var b strings.Builder
	b.WriteString(s.head)
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.row)
	}
	b.WriteString(s.conflict)
	if returning {
		b.WriteString(s.returning)
	}
	return b.String()
}

var (
	insertEvents = rowShape{name: "events",
		head: `INSERT INTO events (id, type, body, created_at) VALUES `,
		row:  `(?,?,?,?)`, perRow: 4,
		conflict: ` ON CONFLICT (id) DO NOTHING`, returning: ` RETURNING seq, id`}
	insertDeliveries = rowShape{name: "deliveries",
		head: `INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at) VALUES `,
		row:  `(?,?,'pending',?,?,?)`, perRow: 5}
	insertInflight = rowShape{name: "inflight",
		head: `INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at, lease_until) VALUES `,
		row:  `(?,?,'inflight',?,?,?,?)`, perRow: 6,
		returning: ` RETURNING seq, subscriber_id, event_seq`}
	insertAttempts = rowShape{name: "attempts",
		head: `INSERT OR IGNORE INTO attempts (delivery_seq, number, subscriber_id, at, lane, status_code,
			error, duration_ms, retry_after_ms, response) VALUES `,
		row: `(?,?,?,?,?,?,?,?,?,?)`, perRow: 10}
)

// stmt returns the writer's prepared statement for rows rows of shape.
func (w *writer) stmt(ctx context.Context, shape rowShape, rows int, returning bool) (*sql.Stmt, error) {
	key := shape.name + "/" + strconv.Itoa(rows)
	if returning {
		key += "/returning"
	}
	if st, ok := w.s.cache[key]; ok {
		return st, nil
	}
	st, err := w.conn.PrepareContext(ctx, shape.sql(rows, returning))
	if err != nil {
		return nil, err
	}
	w.s.cache[key] = st
	w.s.all = append(w.s.all, st)
	return st, nil
}

// insert writes rows (perRow args each) of shape, calling each for every
// row its RETURNING clause yields when each is not nil.
func (w *writer) insert(ctx context.Context, shape rowShape, args []any, each func(*sql.Rows) error) error {
	off := 0
	for _, n := range chunks(len(args) / shape.perRow) {
		st, err := w.stmt(ctx, shape, n, each != nil)
		if err != nil {
			return err
		}
		part := args[off : off+n*shape.perRow]
		off += n * shape.perRow
		if each == nil {
			if _, err := st.ExecContext(ctx, part...); err != nil {
				return err
			}
			continue
		}
		if err := collectStmt(ctx, st, part, each); err != nil {
			return err
		}
	}
	return nil
}

// insertOne writes one row of shape and returns its rowid, or false when
// the conflict clause skipped it. For a single row this is cheaper than
// RETURNING, which SQLite answers from a temporary table.
func (w *writer) insertOne(ctx context.Context, shape rowShape, args ...any) (int64, bool, error) {
	st, err := w.stmt(ctx, shape, 1, false)
	if err != nil {
		return 0, false, err
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return 0, false, err
	}
	seq, err := res.LastInsertId()
	return seq, err == nil, err
}
