package scenario

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/loadtest/instance"
	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
)

// live is the per-subscriber progress view: one line per subscriber,
// redrawn in place on a terminal, reprinted under a time stamp otherwise.
type live struct {
	mu    sync.Mutex // draw and the log lines beside it (chaos draws from a goroutine)
	w     io.Writer  // nil: no view
	tty   bool
	width int // the terminal's columns (tty); 0 when unknown
	drawn int // lines drawn last time (tty)
	// edge: the subscribers receive both lanes' types, so sluice's stats
	// show the tokens of the origin lane's share of each rate.
	edge bool
}

// edgeShare is sluice's default rate.edge_share, which the harness keeps.
const edgeShare = 0.5

// logTo returns log for lines written while the view is drawn in place,
// when they go to the same terminal (onTTY): each goes below the view,
// which is then drawn afresh under it instead of over it.
func (l *live) logTo(log io.Writer, onTTY bool) io.Writer {
	if l == nil || l.w == nil || !l.tty || !onTTY {
		return log
	}
	return liveLog{l, log}
}

type liveLog struct {
	l   *live
	log io.Writer
}

func (g liveLog) Write(p []byte) (int, error) {
	g.l.mu.Lock()
	defer g.l.mu.Unlock()
	g.l.drawn = 0
	return g.log.Write(p)
}

func (l *live) draw(now, start time.Time, specs []Spec, ps []*partner.Partner, st instance.Stats, expected int) {
	if l == nil || l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	if l.tty && l.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", l.drawn)
	}
	lines := []string{fmt.Sprintf("t+%-4s pending %d  inflight %d  sent %d  dead %d",
		now.Sub(start).Round(time.Second), st.Totals.Pending, st.Totals.Inflight, st.Totals.Sent, st.Totals.Dead)}
	for i, s := range specs {
		pg := ps[i].Progress(now)
		adv := ps[i].Config().Advertised
		origin := adv
		if l.edge {
			origin = adv.Scale(1 - edgeShare)
		}
		state := State(pg, st.Of(s.ID), origin, expected, now)
		if state == "sending" && float64(pg.LastSecond) > adv.PerSecond {
			// Above the rate, within rate + burst: say so, or it reads as
			// the cap broken.
			state = fmt.Sprintf("sending its burst of %g", adv.Burst)
		}
		lines = append(lines, fmt.Sprintf("  %-13s %6d/%-6d %s %5d/s of %-6s %s",
			s.ID, pg.Delivered, expected, bar(pg.Delivered, expected, 20), pg.LastSecond,
			fmt.Sprintf("%g/s", adv.PerSecond), state))
	}
	for _, line := range lines {
		if l.tty {
			b.WriteString("\x1b[2K")
			// A line the terminal wrapped would throw the redraw off.
			if r := []rune(line); l.width > 1 && len(r) >= l.width {
				line = string(r[:l.width-1])
			}
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	if !l.tty {
		b.WriteByte('\n')
	}
	l.drawn = len(lines)
	io.WriteString(l.w, b.String())
}

func bar(n, of, width int) string {
	if of <= 0 {
		return "[" + strings.Repeat(" ", width) + "]"
	}
	full := min(width, n*width/of)
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}

// State says in a few words why a subscriber is where it is: drained,
// banned by its partner, breaker open, paused by Retry-After, partner down,
// throttled (its origin bucket, at rate, has no token above the
// reserve a sender keeps), or sending; with its dead letters.
func State(pg partner.Progress, s instance.SubscriberStats, rate bucket.Rate, expected int, now time.Time) string {
	var st string
	switch {
	case expected > 0 && pg.Delivered >= expected:
		st = "drained"
	case pg.Banned:
		st = "BANNED by the partner"
	case s.Breaker == "open":
		st = "breaker open"
	case s.Breaker == "half_open":
		st = "breaker half-open (probing)"
	case s.PausedUntil != nil && s.PausedUntil.After(now):
		st = fmt.Sprintf("paused by Retry-After (%s left)", report.Short(s.PausedUntil.Sub(now)))
	case pg.Mode != partner.Up:
		st = "partner down (" + pg.Mode.String() + ")"
	case s.Pending+s.Inflight > 0 && s.Tokens < 1+rate.SendReserve():
		st = "throttled: burst spent, held to its rate"
	case s.Pending+s.Inflight > 0:
		st = "sending"
	default:
		st = "idle"
	}
	if s.Dead > 0 {
		st += fmt.Sprintf(" · %d dead letters", s.Dead)
	}
	return st
}
