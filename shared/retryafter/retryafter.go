// Package retryafter reads a Retry-After header value: delta-seconds or an
// HTTP-date in any of its three forms. The origin reads it from a
// subscriber's answer and the Worker before it reports one, and both must
// read the same value the same way.
package retryafter

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Parse returns the wait value asks for, from now. ok is false for an empty
// or unreadable value (a negative number, a fraction, RFC 3339), which the
// caller treats as no Retry-After. A date in the past gives 0; a wait longer
// than a Duration holds gives the longest one, for the caller to cap.
func Parse(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if strings.Trim(value, "0123456789") == "" { // delta-seconds: digits alone
		secs, err := strconv.ParseInt(value, 10, 64)
		if err != nil || secs > math.MaxInt64/int64(time.Second) {
			return math.MaxInt64, true // only overflow can fail here
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}
