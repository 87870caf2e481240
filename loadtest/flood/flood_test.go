package flood_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/loadtest/flood"
	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
)

const secret = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"

func start(t *testing.T, cfg partner.Config) *partner.Partner {
	t.Helper()
	cfg.Secret = secret
	p, err := partner.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestFloodCountsEveryRequest(t *testing.T) {
	t.Parallel()
	p := start(t, partner.Config{Name: "honest"})
	res, err := flood.Run(context.Background(), flood.Options{
		URL: p.URL(), Workers: 8, Duration: 30 * time.Second, MaxRequests: 200, Secret: secret,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 200 || res.Accepted != 200 || res.Throttled+res.Rejected+res.Errors != 0 {
		t.Errorf("result %+v, want 200 requests all accepted", res)
	}
	if r := p.Report(nil); r.Delivered != 200 || r.BadSignatures != 0 {
		t.Errorf("partner saw %d deliveries, %d bad signatures; want 200, 0", r.Delivered, r.BadSignatures)
	}
}

// TestFloodShowsALimiterLimits is the seed's check: against a 10/s burst 20
// limiter the accepted count tracks the cap, not the offered load.
func TestFloodShowsALimiterLimits(t *testing.T) {
	t.Parallel()
	rate := bucket.Rate{PerSecond: 10, Burst: 20}
	p := start(t, partner.Config{Name: "limited", Advertised: rate, Enforce: true})
	res, err := flood.Run(context.Background(), flood.Options{
		URL: p.URL(), Workers: 8, Duration: 30 * time.Second, MaxRequests: 100, Secret: secret,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 100 || res.Errors != 0 {
		t.Fatalf("result %+v, want 100 answered requests", res)
	}
	// However slow the machine, no more than the burst plus the refill
	// over the run can be accepted, and the burst always is.
	most := report.Limit(rate, time.Duration(res.Elapsed), 0)
	if res.Accepted < 20 || res.Accepted > most {
		t.Errorf("accepted %d, want between the burst (20) and %d", res.Accepted, most)
	}
	if res.Throttled+res.Rejected != 100-res.Accepted {
		t.Errorf("throttled %d + rejected %d, want the other %d", res.Throttled, res.Rejected, 100-res.Accepted)
	}
}

func TestFloodRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://example.com/x", "http://10.0.0.1/x", "ftp://127.0.0.1/", "http://[::1]:9/x"} {
		err := flood.CheckLoopback(u)
		if want := u == "http://[::1]:9/x"; (err == nil) != want {
			t.Errorf("CheckLoopback(%s) = %v, want ok=%v", u, err, want)
		}
	}
}
