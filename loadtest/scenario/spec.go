// Package scenario runs the seed's incidents end to end: a real `sluice
// serve` on a temporary database, fake partners on 127.0.0.1, a burst of
// events, and an account of every event per subscriber — delivered, still
// owed, dead-lettered or lost — with each partner's busiest second against
// what it advertised. Canal is the 12,000-event burst, Chaos adds kill -9
// restarts and outages, Naive is the seed's loop against the same partners.
package scenario

import (
	"time"

	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/shared/bucket"
)

// Spec is one subscriber of a scenario and the partner behind it.
type Spec struct {
	ID   string // the subscriber id, also the partner's name
	Role string // what it stands for, for the table
	// Partner is the partner's behaviour; Name, Secret and Jitter are
	// filled in by the scenario. Its Advertised rate is also the rate the
	// subscriber is created with.
	Partner     partner.Config
	TimeoutMS   int // the subscriber's attempt timeout (0: sluice's default)
	MaxAttempts int // 0: sluice's default
	// SlowToDrain marks a subscriber whose advertised rate or answer time
	// makes it too slow to drain within a bounded run: the scenario does
	// not wait for it, and reports its progress instead.
	SlowToDrain bool
}

// partnerDash is the seed's partner dashboard: it advertises 10/s with a
// burst of 20 and bans clients that ignore its 429s.
var partnerDash = Spec{
	ID: "partner-dash", Role: "10/s burst 20, bans",
	Partner: partner.Config{
		Advertised: bucket.Rate{PerSecond: 10, Burst: 20},
		Enforce:    true, BanAfter: 5, BanFor: time.Hour,
	},
	SlowToDrain: true,
}

// CanalSpecs are the seed's five subscribers: a partner dashboard that
// advertises 10/s with a burst of 20 and bans clients that ignore its 429s,
// a Slack relay that takes 2 s to answer, two fast analytics sinks, and a
// customer's flaky CRM.
func CanalSpecs() []Spec {
	return []Spec{
		partnerDash,
		{
			ID: "slack-relay", Role: "slow relay, 2s answers",
			Partner:     partner.Config{Advertised: bucket.Rate{PerSecond: 50, Burst: 100}, Delay: 2 * time.Second},
			TimeoutMS:   5000,
			SlowToDrain: true,
		},
		{
			ID: "analytics-a", Role: "fast sink",
			Partner: partner.Config{Advertised: bucket.Rate{PerSecond: 1000, Burst: 2000}},
		},
		{
			ID: "analytics-b", Role: "fast sink",
			Partner: partner.Config{Advertised: bucket.Rate{PerSecond: 1000, Burst: 2000}},
		},
		{
			ID: "crm", Role: "flaky CRM",
			Partner: partner.Config{
				Advertised: bucket.Rate{PerSecond: 500, Burst: 1000},
				Faults:     partner.Faults{Error: 0.05, Reset: 0.01, Timeout: 0.005, Hold: 30 * time.Second},
			},
			TimeoutMS: 2000,
		},
	}
}

// ChaosSpecs are the subscribers of the chaos run: the banning 10/s partner,
// a fast sink, a flakier CRM, a relay answering in 300 ms, and a partner
// that goes down mid-run (see Chaos).
func ChaosSpecs() []Spec {
	return []Spec{
		partnerDash,
		{
			ID: "analytics", Role: "fast sink",
			Partner: partner.Config{Advertised: bucket.Rate{PerSecond: 1000, Burst: 2000}},
		},
		{
			ID: "crm", Role: "flaky CRM",
			Partner: partner.Config{
				Advertised: bucket.Rate{PerSecond: 500, Burst: 1000},
				Faults:     partner.Faults{Error: 0.10, Reset: 0.03, Timeout: 0.01, Hold: 30 * time.Second},
			},
			TimeoutMS: 1000,
		},
		{
			ID: "relay", Role: "slow relay, 300ms answers",
			Partner:   partner.Config{Advertised: bucket.Rate{PerSecond: 100, Burst: 200}, Delay: 300 * time.Millisecond},
			TimeoutMS: 5000,
		},
		{
			ID: outageID, Role: "down mid-run",
			Partner: partner.Config{Advertised: bucket.Rate{PerSecond: 200, Burst: 400}, DownRetryAfter: 2 * time.Second},
		},
	}
}

// outageID is the chaos subscriber whose partner the run takes down.
const outageID = "outage"
