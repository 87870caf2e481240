package naive_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-dev/sluice/loadtest/naive"
	"github.com/sluice-dev/sluice/loadtest/partner"
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

// TestNaiveLoopDropsWhatFails: no retries, no limits — what a partner
// refuses is gone, and a limiter's 429s only earn a ban.
func TestNaiveLoopDropsWhatFails(t *testing.T) {
	t.Parallel()
	honest := start(t, partner.Config{Name: "honest"})
	broken := start(t, partner.Config{Name: "broken", Faults: partner.Faults{Error: 1}})
	limited := start(t, partner.Config{Name: "limited", Advertised: bucket.Rate{PerSecond: 1, Burst: 5}, Enforce: true, BanAfter: 3})
	var events []naive.Event
	for i := range 40 {
		id := fmt.Sprintf("evt_%d", i)
		events = append(events, naive.Event{ID: id, Body: []byte(fmt.Sprintf(`{"id":%q,"type":"video.trending"}`, id))})
	}
	out, err := naive.Run(context.Background(), naive.Options{
		Targets: []naive.Target{
			{ID: "honest", URL: honest.URL(), Secret: secret},
			{ID: "broken", URL: broken.URL(), Secret: secret},
			{ID: "limited", URL: limited.URL(), Secret: secret},
		},
		Events: events, Workers: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if o := out["honest"]; *o != (naive.Outcome{Attempted: 40, OK: 40}) {
		t.Errorf("honest: %+v, want all 40 delivered", *o)
	}
	if o := out["broken"]; *o != (naive.Outcome{Attempted: 40, Failed: 40}) {
		t.Errorf("broken: %+v, want all 40 dropped", *o)
	}
	// One loop sends as fast as answers come: far faster than 1/s, so the
	// burst of 5 (and whatever refilled meanwhile) gets through, then
	// 429s, then a ban; each refused event is dropped.
	o := out["limited"]
	if o.Attempted != 40 || o.OK < 5 || o.OK+o.Failed != 40 {
		t.Errorf("limited: %+v, want 40 attempts, at least the burst of 5 delivered, the rest dropped", *o)
	}
	if r := limited.Report(nil); !r.Banned || r.BadSignatures != 0 {
		t.Errorf("limited partner: banned %v, bad signatures %d; want banned, 0", r.Banned, r.BadSignatures)
	}
}

func TestNaiveLoopStopsWithItsContext(t *testing.T) {
	t.Parallel()
	honest := start(t, partner.Config{Name: "honest"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, err := naive.Run(ctx, naive.Options{
		Targets: []naive.Target{{ID: "honest", URL: honest.URL(), Secret: secret}},
		Events:  []naive.Event{{ID: "a", Body: []byte(`{"id":"a"}`)}, {ID: "b", Body: []byte(`{"id":"b"}`)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if o := out["honest"]; o.Attempted+o.Unsent != 2 || o.Failed != 0 {
		t.Errorf("after cancel: %+v, want the 2 events attempted or unsent, none counted as failed", *o)
	}
}
