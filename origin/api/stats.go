package api

import (
	"net/http"
	"sort"
	"time"

	"github.com/labstack/echo/v4"
)

// statsWindow is the window success rate and latency are computed over.
const statsWindow = 5 * time.Minute

type subscriberStats struct {
	ID          string     `json:"subscriber_id"`
	Pending     int        `json:"pending"`
	Inflight    int        `json:"inflight"` // claimed: on the wire or queued for a worker
	Sending     int        `json:"attempts_in_flight"`
	Sent        int        `json:"sent"`
	Dead        int        `json:"dead"`
	Attempts    int        `json:"attempts_5m"`
	SuccessRate *float64   `json:"success_rate"` // null when no attempt was made in the window
	P50MS       *int64     `json:"p50_ms"`       // null when nothing was delivered in the window
	P99MS       *int64     `json:"p99_ms"`
	Breaker     string     `json:"breaker"`
	PausedUntil *time.Time `json:"paused_until"`
	Tokens      float64    `json:"tokens"`
	Rate        rateView   `json:"rate"`
	Paused      bool       `json:"paused"` // by the operator
}

// rateView is a rate as the API shows it. Stats carry it so a dashboard
// need not read subscribers (whose answers carry secrets) to compare current
// and allowed. A subscriber's shows edge_share only where it can matter:
// with an edge lane configured, or set away from the default.
type rateView struct {
	PerSecond float64  `json:"per_second"`
	Burst     float64  `json:"burst"`
	EdgeShare *float64 `json:"edge_share,omitempty"`
}

func (s *Server) stats(c echo.Context) error {
	now := s.Now()
	st, err := s.Ledger.Stats(c.Request().Context(), now.Add(-statsWindow))
	if err != nil {
		return err
	}
	snap := s.Dispatcher.Snapshot()
	var total subscriberStats
	var okTotal int
	subs := make([]subscriberStats, 0, len(snap))
	for id, sn := range snap {
		row := subscriberStats{ID: id, Breaker: string(sn.Breaker.State), Tokens: sn.Tokens, Sending: sn.Inflight,
			Rate: rateView{PerSecond: sn.Rate.PerSecond, Burst: sn.Rate.Burst}, Paused: sn.Paused}
		if row.Breaker == "" {
			row.Breaker = "closed"
		}
		if sn.PausedUntil.After(now) {
			t := millis(sn.PausedUntil)
			row.PausedUntil = &t
		}
		if v, ok := st[id]; ok {
			row.Pending, row.Inflight, row.Sent, row.Dead = v.Pending, v.Inflight, v.Sent, v.Dead
			row.Attempts = v.Attempts
			if v.Delivered > 0 {
				p50, p99 := v.P50.Milliseconds(), v.P99.Milliseconds()
				row.P50MS, row.P99MS = &p50, &p99
			}
			if v.Attempts > 0 {
				r := float64(v.Successes) / float64(v.Attempts)
				row.SuccessRate = &r
			}
			okTotal += v.Successes
		}
		total.Pending += row.Pending
		total.Inflight += row.Inflight
		total.Sending += row.Sending
		total.Sent += row.Sent
		total.Dead += row.Dead
		total.Attempts += row.Attempts
		subs = append(subs, row)
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].ID < subs[j].ID })
	totals := map[string]any{
		"pending": total.Pending, "inflight": total.Inflight, "attempts_in_flight": total.Sending, "sent": total.Sent,
		"dead": total.Dead, "attempts_5m": total.Attempts, "success_rate": nil, "p50_ms": nil, "p99_ms": nil,
	}
	if total.Attempts > 0 {
		totals["success_rate"] = float64(okTotal) / float64(total.Attempts)
	}
	// The latency of every delivery in the window together, not an
	// average of the subscribers' percentiles.
	if w := s.Ledger.WindowTotals(now.Add(-statsWindow)); w.Delivered > 0 {
		totals["p50_ms"], totals["p99_ms"] = w.P50.Milliseconds(), w.P99.Milliseconds()
	}
	return c.JSON(http.StatusOK, map[string]any{"subscribers": subs, "totals": totals, "window_seconds": int(statsWindow.Seconds())})
}
