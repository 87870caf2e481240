package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
)

func openLedger(t *testing.T) *ledger.Ledger {
	t.Helper()
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "sluice.db")
	if _, err := ledger.Migrate(ctx, db, time.Now()); err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(ctx, db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A plaintext token kept by an earlier version keeps working, but from the
// first start on the database holds only its digest.
func TestAPITokenKeptInPlaintextIsReplacedByItsDigest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := openLedger(t)
	if err := l.SetSetting(ctx, legacyTokenKey, "sk_old"); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	got, err := apiToken(ctx, l, "", &out)
	if err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256([]byte("sk_old")); got != want {
		t.Fatalf("digest %x, want the old token's %x", got, want)
	}
	if v, _ := l.Setting(ctx, legacyTokenKey); v != "" {
		t.Errorf("the plaintext token is still kept: %q", v)
	}
	if v, _ := l.Setting(ctx, tokenDigestKey); v != hex.EncodeToString(got[:]) {
		t.Errorf("kept digest %q, want %x", v, got)
	}
	if strings.Contains(out.String(), "sk_old") {
		t.Errorf("the kept token was printed: %q", out.String())
	}
}

// A given token wins and nothing is stored; an unreadable digest stops the
// start with a message that says what to do, rather than locking everyone out.
func TestAPITokenGivenOrUnreadable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := openLedger(t)
	got, err := apiToken(ctx, l, "given", &bytes.Buffer{})
	if err != nil || got != sha256.Sum256([]byte("given")) {
		t.Fatalf("apiToken(given) = %x, %v", got, err)
	}
	if v, _ := l.Setting(ctx, tokenDigestKey); v != "" {
		t.Errorf("a given token left a digest behind: %q", v)
	}
	if err := l.SetSetting(ctx, tokenDigestKey, "not hex"); err != nil {
		t.Fatal(err)
	}
	if _, err := apiToken(ctx, l, "", &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--api-token") {
		t.Errorf("unreadable digest: err = %v, want one that names --api-token", err)
	}
}
