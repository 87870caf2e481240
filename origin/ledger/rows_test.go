package ledger

import (
	"slices"
	"strings"
	"testing"
)

func TestChunksCoverEveryRowWithPreparedSizes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int][]int{
		0: nil, 1: {1}, 5: {4, 1}, 1000: {256, 256, 256, 64, 64, 64, 16, 16, 4, 4},
	} {
		if got := chunks(n); !slices.Equal(got, want) {
			t.Errorf("chunks(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestRowShapeRepeatsRows(t *testing.T) {
	t.Parallel()
	got := insertDeliveries.sql(2, false)
	want := `INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at) VALUES ` +
		`(?,?,'pending',?,?,?),(?,?,'pending',?,?,?)`
	if got != want {
		t.Fatalf("sql(2) =\n%s\nwant\n%s", got, want)
	}
	if got := insertEvents.sql(1, true); !strings.HasSuffix(got, `(?,?,?,?) ON CONFLICT (id) DO NOTHING RETURNING seq, id`) {
		t.Fatalf("events with RETURNING: %s", got)
	}
	if got := insertEvents.sql(1, false); strings.Contains(got, "RETURNING") {
		t.Fatalf("events without RETURNING: %s", got)
	}
	for _, shape := range []rowShape{insertEvents, insertDeliveries, insertInflight, insertAttempts} {
		if n := strings.Count(shape.row, "?"); n != shape.perRow {
			t.Errorf("a row of %s has %d parameters, perRow says %d", shape.name, n, shape.perRow)
		}
	}
}
