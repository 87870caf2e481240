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

func TestRowShapeNumbersParameters(t *testing.T) {
	t.Parallel()
	got := insertDeliveries.sql(2)
	want := `INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at) VALUES ` +
		`(?2,?3,'pending',?1,?1,?1),(?4,?5,'pending',?1,?1,?1)`
	if got != want {
		t.Fatalf("sql(2) =\n%s\nwant\n%s", got, want)
	}
	if got := insertAttempts.sql(2); !strings.Contains(got, "(?11,?12,?13,?14,?15,?16,?17,?18,?19,?20)") {
		t.Fatalf("second attempt row misnumbered: %s", got)
	}
}
