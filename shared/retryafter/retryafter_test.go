package retryafter_test

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/retryafter"
)

func TestParse(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, time.March, 10, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		value  string
		want   time.Duration
		wantOK bool
	}{
		{"120", 2 * time.Minute, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{"999999", 999999 * time.Second, true},
		{"99999999999999999999999", math.MaxInt64, true},
		{"9223372037", math.MaxInt64, true}, // seconds past what a Duration holds
		{"-1", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"abc", 0, false},
		{"", 0, false},
		{"  ", 0, false},
		{"Sun, 10 Mar 2024 12:02:00 GMT", 2 * time.Minute, true},   // RFC 1123
		{"Sunday, 10-Mar-24 12:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Sun Mar 10 12:10:00 2024", 10 * time.Minute, true},       // ANSI C asctime
		{"Sun Mar  3 12:00:00 2024", 0, true},                      // asctime, in the past
		{"Sun, 10 Mar 2024 11:59:59 GMT", 0, true},                 // one second ago
		{"Sun, 10 Mar 2024 14:00:00 GMT", 2 * time.Hour, true},
		{"2024-03-10T12:02:00Z", 0, false}, // RFC 3339 is not an HTTP-date
	}
	for _, tc := range tests {
		got, ok := retryafter.Parse(tc.value, now)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tc.value, got, ok, tc.want, tc.wantOK)
		}
	}
}
