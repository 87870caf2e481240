package ledger

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/migrations"
)

// Each rotated-out secret signs for its own grace period, however many
// rotations come within it, up to MaxPreviousSecrets.
func TestRotateKeepsEachSecretItsGrace(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	s := Subscriber{Secret: "a"}
	s.Rotate("b", t0, day)
	s.Rotate("c", t0.Add(time.Hour), day)
	for _, c := range []struct {
		at   time.Duration
		want []string
	}{
		{2 * time.Hour, []string{"c", "b", "a"}},
		{day - time.Millisecond, []string{"c", "b", "a"}},
		{day, []string{"c", "b"}},
		{day + time.Hour, []string{"c"}},
	} {
		if got := s.Secrets(t0.Add(c.at)); !slices.Equal(got, c.want) {
			t.Errorf("Secrets at +%v = %v, want %v", c.at, got, c.want)
		}
	}
	if got, want := s.SecretsChange(t0.Add(2*time.Hour)), t0.Add(day); !got.Equal(want) {
		t.Errorf("SecretsChange = %v, want when a stops signing, %v", got, want)
	}
	if got, want := s.RotationEnds(t0.Add(2*time.Hour)), t0.Add(day+time.Hour); !got.Equal(want) {
		t.Errorf("RotationEnds = %v, want when b stops signing, %v", got, want)
	}
	if got := s.RotationEnds(t0.Add(2 * day)); !got.IsZero() {
		t.Errorf("RotationEnds after every grace period = %v, want zero", got)
	}

	// Back to a secret still in its grace: it signs once, as the current one.
	s.Rotate("a", t0.Add(2*time.Hour), day)
	if got, want := s.Secrets(t0.Add(3*time.Hour)), []string{"a", "c", "b"}; !slices.Equal(got, want) {
		t.Errorf("after rotating back to a: %v, want %v", got, want)
	}
	// A burst of rotations keeps the newest MaxPreviousSecrets signing.
	for i, secret := range []string{"d", "e", "f", "g", "h"} {
		s.Rotate(secret, t0.Add(3*time.Hour+time.Duration(i)*time.Minute), day)
	}
	if got, want := s.Secrets(t0.Add(4*time.Hour)), []string{"h", "g", "f", "e", "d"}; !slices.Equal(got, want) {
		t.Errorf("after five more rotations: %v, want %v", got, want)
	}
	// Rotating to the current secret (two requests racing) changes nothing.
	s.Rotate("h", t0.Add(5*time.Hour), day)
	if got, want := s.Secrets(t0.Add(5*time.Hour)), []string{"h", "g", "f", "e", "d"}; !slices.Equal(got, want) {
		t.Errorf("after rotating to the current secret: %v, want %v", got, want)
	}
}

func TestPreviousSecretsAreStored(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	for _, secret := range []string{"whsec_b", "whsec_c"} {
		if _, err := l.UpdateSubscriber(ctx, "s", func(s *Subscriber) { s.Rotate(secret, clock.Now(), time.Hour) }); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute)
	}
	got, err := l.Subscriber(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	want := []PreviousSecret{{"whsec_b", t0.Add(time.Minute + time.Hour)}, {"whsec_x", t0.Add(time.Hour)}}
	if got.Secret != "whsec_c" || !slices.EqualFunc(got.Previous, want, func(a, b PreviousSecret) bool {
		return a.Secret == b.Secret && a.Until.Equal(b.Until)
	}) {
		t.Fatalf("stored secret %q, previous %+v; want whsec_c and %+v", got.Secret, got.Previous, want)
	}
}

// oldLedger writes a database at path as a sluice that knew only the first
// n migrations left it, with the rows insert adds.
func oldLedger(t *testing.T, path string, n int, insert string, args ...any) {
	t.Helper()
	db, err := sql.Open("sqlite", dsn(path, writerRole))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`)
	for _, m := range all[:n] {
		exec(m.SQL)
		exec(`INSERT INTO schema_migrations VALUES (?, ?, 0)`, m.Version, m.Name)
	}
	exec(insert, args...)
}

// A ledger from before migration 3 kept one previous secret in two columns;
// the migration carries it, with its grace, into the list.
func TestMigrationCarriesThePreviousSecretOver(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.db")
	until := t0.Add(time.Hour)
	oldLedger(t, path, 2, `INSERT INTO subscribers (id, url, event_types, rate_per_second, rate_burst, max_attempts, timeout_ms, secret,
		previous_secret, previous_until, created_at, updated_at) VALUES
		('rotated', 'http://127.0.0.1:1/', '["*"]', 10, 20, 3, 1000, 'whsec_new', 'whsec_old', ?, 0, 0),
		('plain', 'http://127.0.0.1:1/', '["*"]', 10, 20, 3, 1000, 'whsec_one', '', 0, 0, 0)`, until.UnixMilli())

	ctx := context.Background()
	l, err := Open(ctx, path, Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rotated, err := l.Subscriber(ctx, "rotated")
	if err != nil {
		t.Fatal(err)
	}
	if got := rotated.Secrets(t0); !slices.Equal(got, []string{"whsec_new", "whsec_old"}) {
		t.Errorf("migrated rotation signs with %v, want whsec_new and whsec_old", got)
	}
	if got := rotated.RotationEnds(t0); !got.Equal(until) {
		t.Errorf("migrated rotation ends %v, want %v", got, until)
	}
	plain, err := l.Subscriber(ctx, "plain")
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Previous) != 0 {
		t.Errorf("a subscriber never rotated has previous secrets %+v", plain.Previous)
	}
}

// Before migration 4 only its value told a set burst from one that follows
// the rate: the migration marks as set every burst that is not twice the
// rate, and a ledger keeps the mark it is given.
func TestMigrationMarksTheBurstsThatWereSet(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.db")
	oldLedger(t, path, 3, `INSERT INTO subscribers (id, url, event_types, rate_per_second, rate_burst, max_attempts, timeout_ms, secret,
		created_at, updated_at) VALUES
		('derived', 'http://127.0.0.1:1/', '["*"]', 10, 20, 3, 1000, 'whsec_a', 0, 0),
		('capped', 'http://127.0.0.1:1/', '["*"]', 900000, 1000000, 3, 1000, 'whsec_b', 0, 0),
		('slow', 'http://127.0.0.1:1/', '["*"]', 0.2, 1, 3, 1000, 'whsec_c', 0, 0),
		('set', 'http://127.0.0.1:1/', '["*"]', 10, 7, 3, 1000, 'whsec_d', 0, 0)`)
	ctx := context.Background()
	l, err := Open(ctx, path, Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for id, want := range map[string]bool{"derived": false, "capped": false, "slow": false, "set": true} {
		s, err := l.Subscriber(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Rate.BurstGiven != want {
			t.Errorf("%s (%v/s, burst %v): burst given %v, want %v", id, s.Rate.PerSecond, s.Rate.Burst, s.Rate.BurstGiven, want)
		}
	}
	s := Subscriber{ID: "new", URL: "http://127.0.0.1:1/", EventTypes: []string{"*"}, Rate: Rate{PerSecond: 10, Burst: 20, BurstGiven: true},
		MaxAttempts: 3, TimeoutMS: 1000, Secret: "whsec_e"}
	if err := l.CreateSubscriber(ctx, &s); err != nil {
		t.Fatal(err)
	}
	if got, err := l.Subscriber(ctx, "new"); err != nil || !got.Rate.BurstGiven {
		t.Errorf("a burst created as set reads back as %+v, %v", got.Rate, err)
	}
	got, err := l.UpdateSubscriber(ctx, "new", func(s *Subscriber) { s.Rate.BurstGiven = false })
	if err != nil || got.Rate.BurstGiven {
		t.Fatalf("update = %+v, %v", got.Rate, err)
	}
	if got, err := l.Subscriber(ctx, "new"); err != nil || got.Rate.BurstGiven {
		t.Errorf("a burst updated to follow the rate reads back as %+v, %v", got.Rate, err)
	}
}
