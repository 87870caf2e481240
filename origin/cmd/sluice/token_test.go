package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
)

func openLedger(t *testing.T) (*ledger.Ledger, string) {
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
	return l, db
}

// A plaintext token kept by an earlier version keeps working, but from the
// first start on, given a token or not, the database holds only its digest,
// and the file no longer holds the token's bytes.
func TestAPITokenKeptInPlaintextIsReplacedByItsDigest(t *testing.T) {
	t.Parallel()
	const old = "sk_old_plaintext_0123456789abcdef"
	for _, given := range []string{"", "given"} {
		ctx := context.Background()
		l, db := openLedger(t)
		if err := l.SetSetting(ctx, legacyTokenKey, old); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		got, err := apiToken(ctx, l, given, &out)
		if err != nil {
			t.Fatal(err)
		}
		want := sha256.Sum256([]byte(old))
		if given != "" {
			want = sha256.Sum256([]byte(given))
		}
		if got != want {
			t.Errorf("given %q: digest %x, want %x", given, got, want)
		}
		if v, _ := l.Setting(ctx, legacyTokenKey); v != "" {
			t.Errorf("given %q: the plaintext token is still kept: %q", given, v)
		}
		kept := sha256.Sum256([]byte(old))
		if v, _ := l.Setting(ctx, tokenDigestKey); v != hex.EncodeToString(kept[:]) {
			t.Errorf("given %q: kept digest %q, want the old token's %x", given, v, kept)
		}
		if strings.Contains(out.String(), old) {
			t.Errorf("given %q: the kept token was printed: %q", given, out.String())
		}
		for _, f := range []string{db, db + "-wal"} {
			b, err := os.ReadFile(f)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte(old)) {
				t.Errorf("given %q: %s still holds the old token's bytes", given, filepath.Base(f))
			}
		}
	}
}

// A given token wins and nothing is stored; an unreadable digest stops the
// start with a message that says what to do, rather than locking everyone out.
func TestAPITokenGivenOrUnreadable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _ := openLedger(t)
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
