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

// rowShape is a multi-row statement: head, then one row template per row
// (with ?N placeholders numbered from 1 within the row and ?S for the
// shared parameter, which comes first), then tail.
type rowShape struct {
	name      string
	head      string
	row       string
	tail      string
	perRow    int
	hasShared bool
}

func (s rowShape) sql(rows int) string {
	var b strings.Builder
	b.WriteString(s.head)
	base := 0
	if s.hasShared {
		base = 1
	}
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		writeRow(&b, s.row, base+i*s.perRow)
	}
	b.WriteString(s.tail)
	return b.String()
}

var (
	insertEvents = rowShape{name: "events",
		head: `INSERT INTO events (id, type, body, created_at) VALUES `,
		row:  `(?1,?2,?3,?S)`, perRow: 3, hasShared: true,
		tail: ` ON CONFLICT (id) DO NOTHING RETURNING seq, id`}
	insertDeliveries = rowShape{name: "deliveries",
		head: `INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at) VALUES `,
		row:  `(?1,?2,'pending',?S,?S,?S)`, perRow: 2, hasShared: true}
	insertInflight = rowShape{name: "inflight",
		head: `INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at, lease_until) VALUES `,
		row:  `(?1,?2,'inflight',?S,?S,?S,?3)`, perRow: 3, hasShared: true,
		tail: ` RETURNING seq, subscriber_id, event_seq`}
	insertAttempts = rowShape{name: "attempts",
		head: `INSERT OR IGNORE INTO attempts (delivery_seq, number, subscriber_id, at, lane, status_code,
			error, duration_ms, retry_after_ms, response) VALUES `,
		row: `(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)`, perRow: 10}
)

// writeRow copies a row template, renumbering ?N to ?(offset+N) and ?S to ?1.
func writeRow(b *strings.Builder, row string, offset int) {
	for i := 0; i < len(row); i++ {
		c := row[i]
		if c != '?' || i+1 >= len(row) {
			b.WriteByte(c)
			continue
		}
		if row[i+1] == 'S' {
			b.WriteString("?1")
			i++
			continue
		}
		j := i + 1
		for j < len(row) && row[j] >= '0' && row[j] <= '9' {
			j++
		}
		n, _ := strconv.Atoi(row[i+1 : j])
		b.WriteString("?" + strconv.Itoa(offset+n))
		i = j - 1
	}
}

// stmt returns the writer's prepared statement for rows rows of shape.
func (w *writer) stmt(ctx context.Context, shape rowShape, rows int) (*sql.Stmt, error) {
	key := shape.name + "/" + strconv.Itoa(rows)
	if st, ok := w.s.cache[key]; ok {
		return st, nil
	}
	st, err := w.conn.PrepareContext(ctx, shape.sql(rows))
	if err != nil {
		return nil, err
	}
	w.s.cache[key] = st
	w.s.all = append(w.s.all, st)
	return st, nil
}

// insert writes rows (perRow args each) of shape with the shared argument,
// calling each for every row a RETURNING clause yields.
func (w *writer) insert(ctx context.Context, shape rowShape, shared any, args []any, each func(*sql.Rows) error) error {
	off := 0
	for _, n := range chunks(len(args) / shape.perRow) {
		st, err := w.stmt(ctx, shape, n)
		if err != nil {
			return err
		}
		part := args[off : off+n*shape.perRow]
		off += n * shape.perRow
		if shape.hasShared {
			part = append([]any{shared}, part...)
		}
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
