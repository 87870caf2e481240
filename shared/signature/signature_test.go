package signature_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluice-dev/sluice/shared/signature"
)

// vector is one entry of testdata/vectors.json. The signatures were produced
// once by the public Standard Webhooks Go library; the first vector is the
// example from the spec. PreviousSecret, when set, signs second (a rotation).
type vector struct {
	Name           string `json:"name"`
	Secret         string `json:"secret"`
	PreviousSecret string `json:"previous_secret"`
	ID             string `json:"id"`
	Timestamp      int64  `json:"timestamp"`
	Body           string `json:"body"`
	Signature      string `json:"signature"`
}

func (v vector) secrets() []string {
	if v.PreviousSecret == "" {
		return []string{v.Secret}
	}
	return []string{v.Secret, v.PreviousSecret}
}

func loadVectors(tb testing.TB) []vector {
	tb.Helper()
	data, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		tb.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(data, &vs); err != nil {
		tb.Fatal(err)
	}
	if len(vs) < 4 {
		tb.Fatalf("got %d vectors, want at least 4", len(vs))
	}
	return vs
}

func mustSigner(tb testing.TB, secrets ...string) *signature.Signer {
	tb.Helper()
	s, err := signature.NewSigner(secrets...)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

const (
	secretA = "whsec_AQgPFh0kKzI5QEdOVVxjanF4f4aNlJuiqbC3vsXM09o="
	secretB = "whsec_ZGtyeYCHjpWco6qxuL/GzdTb4unw9/4FDBMaISgvNj0="
)

func TestSignerReproducesVectors(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			s := mustSigner(t, v.secrets()...)
			ts := time.Unix(v.Timestamp, 0)
			if got := s.Signature(v.ID, ts, []byte(v.Body)); got != v.Signature {
				t.Errorf("Signature = %q, want %q", got, v.Signature)
			}

			h := http.Header{}
			s.Set(h, v.ID, ts, []byte(v.Body))
			want := map[string]string{
				"webhook-id":        v.ID,
				"webhook-timestamp": strconv.FormatInt(v.Timestamp, 10),
				"webhook-signature": v.Signature,
			}
			for name, value := range want {
				if got := h.Get(name); got != value {
					t.Errorf("header %s = %q, want %q", name, got, value)
				}
			}

			for _, secret := range v.secrets() {
				if err := signature.Verify(h, []byte(v.Body), ts, secret); err != nil {
					t.Errorf("Verify with one of the vector's secrets: %v", err)
				}
			}
		})
	}
}

func TestLibraryVerifiesOurs(t *testing.T) {
	t.Parallel()
	// The library checks the timestamp against time.Now, so sign at time.Now.
	now := time.Now()
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			mustSigner(t, v.secrets()...).Set(h, v.ID, now, []byte(v.Body))
			for _, secret := range v.secrets() {
				wh, err := standardwebhooks.NewWebhook(secret)
				if err != nil {
					t.Fatal(err)
				}
				if err := wh.Verify([]byte(v.Body), h); err != nil {
					t.Errorf("library rejects our signature: %v", err)
				}
				if err := wh.Verify([]byte(v.Body+" "), h); err == nil {
					t.Error("library accepts our signature for another body")
				}
			}
		})
	}
}

func TestWeVerifyLibrary(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			ts := time.Unix(v.Timestamp, 0)
			wh, err := standardwebhooks.NewWebhook(v.Secret)
			if err != nil {
				t.Fatal(err)
			}
			sig, err := wh.Sign(v.ID, ts, []byte(v.Body))
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			h.Set(standardwebhooks.HeaderWebhookID, v.ID)
			h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(v.Timestamp, 10))
			h.Set(standardwebhooks.HeaderWebhookSignature, sig)
			if err := signature.Verify(h, []byte(v.Body), ts.Add(time.Minute), v.Secret); err != nil {
				t.Errorf("we reject the library's signature: %v", err)
			}
		})
	}
}

func TestVerifyFailures(t *testing.T) {
	t.Parallel()
	const id = "evt_1"
	ts := time.Unix(1700000000, 0)
	body := []byte(`{"type":"video.trending","id":"evt_1"}`)
	signed := func() http.Header {
		h := http.Header{}
		mustSigner(t, secretA).Set(h, id, ts, body)
		return h
	}
	if err := signature.Verify(signed(), body, ts, secretA); err != nil {
		t.Fatalf("the untouched header must verify: %v", err)
	}

	tests := []struct {
		name    string
		edit    func(h http.Header)
		body    []byte
		now     time.Time
		secrets []string
		want    error
	}{
		{name: "missing id", edit: func(h http.Header) { h.Del("webhook-id") }, want: signature.ErrMissingHeaders},
		{name: "missing timestamp", edit: func(h http.Header) { h.Del("webhook-timestamp") }, want: signature.ErrMissingHeaders},
		{name: "missing signature", edit: func(h http.Header) { h.Del("webhook-signature") }, want: signature.ErrMissingHeaders},
		{name: "empty signature", edit: func(h http.Header) { h.Set("webhook-signature", "") }, want: signature.ErrMissingHeaders},
		{name: "timestamp not a number", edit: func(h http.Header) { h.Set("webhook-timestamp", "yesterday") }, want: signature.ErrInvalidHeaders},
		{name: "timestamp with fraction", edit: func(h http.Header) { h.Set("webhook-timestamp", "1700000000.5") }, want: signature.ErrInvalidHeaders},
		{name: "timestamp in milliseconds overflows", edit: func(h http.Header) { h.Set("webhook-timestamp", "99999999999999999999") }, want: signature.ErrInvalidHeaders},
		{name: "too old", now: ts.Add(signature.Tolerance + time.Second), want: signature.ErrTooOld},
		{name: "too new", now: ts.Add(-signature.Tolerance - time.Second), want: signature.ErrTooNew},
		{name: "wrong secret", secrets: []string{secretB}, want: signature.ErrNoMatch},
		{name: "tampered body", body: []byte(`{"type":"video.trending","id":"evt_2"}`), want: signature.ErrNoMatch},
		{name: "tampered id", edit: func(h http.Header) { h.Set("webhook-id", "evt_2") }, want: signature.ErrNoMatch},
		{name: "timestamp moved by a second", edit: func(h http.Header) { h.Set("webhook-timestamp", "1700000001") }, want: signature.ErrNoMatch},
		{name: "v2 prefix only", edit: func(h http.Header) {
			h.Set("webhook-signature", strings.Replace(h.Get("webhook-signature"), "v1,", "v2,", 1))
		}, want: signature.ErrNoMatch},
		{name: "bare signature without version", edit: func(h http.Header) {
			h.Set("webhook-signature", strings.TrimPrefix(h.Get("webhook-signature"), "v1,"))
		}, want: signature.ErrNoMatch},
		{name: "garbage signature", edit: func(h http.Header) { h.Set("webhook-signature", "v1,garbage v1, ,,, v1") }, want: signature.ErrNoMatch},
		{name: "no secret", secrets: []string{}, want: signature.ErrInvalidSecret},
		{name: "invalid secret", secrets: []string{secretA, "whsec_short"}, want: signature.ErrInvalidSecret},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := signed()
			if tc.edit != nil {
				tc.edit(h)
			}
			b, now, secrets := body, ts, []string{secretA}
			if tc.body != nil {
				b = tc.body
			}
			if !tc.now.IsZero() {
				now = tc.now
			}
			if tc.secrets != nil {
				secrets = tc.secrets
			}
			err := signature.Verify(h, b, now, secrets...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestVerifyToleranceIsInclusive(t *testing.T) {
	t.Parallel()
	ts := time.Unix(1700000000, 0)
	body := []byte(`{}`)
	h := http.Header{}
	mustSigner(t, secretA).Set(h, "evt_1", ts, body)
	for _, now := range []time.Time{ts.Add(signature.Tolerance), ts.Add(-signature.Tolerance)} {
		if err := signature.Verify(h, body, now, secretA); err != nil {
			t.Errorf("Verify at %v from the timestamp: %v", now.Sub(ts), err)
		}
	}
}

func TestVerifyRotation(t *testing.T) {
	t.Parallel()
	ts := time.Unix(1700000000, 0)
	body := []byte(`{"type":"a"}`)

	oldOnly := http.Header{}
	mustSigner(t, secretB).Set(oldOnly, "evt_1", ts, body)
	if err := signature.Verify(oldOnly, body, ts, secretA, secretB); err != nil {
		t.Errorf("signed by the old secret, verifier holds both: %v", err)
	}
	if err := signature.Verify(oldOnly, body, ts, secretA); !errors.Is(err, signature.ErrNoMatch) {
		t.Errorf("signed by the old secret, verifier holds only the new one: got %v, want ErrNoMatch", err)
	}

	both := http.Header{}
	mustSigner(t, secretA, secretB).Set(both, "evt_1", ts, body)
	for _, secret := range []string{secretA, secretB} {
		if err := signature.Verify(both, body, ts, secret); err != nil {
			t.Errorf("signed by both, verifier holds one: %v", err)
		}
	}
}

func TestNewSecret(t *testing.T) {
	t.Parallel()
	seq := make([]byte, 40)
	for i := range seq {
		seq[i] = byte(i)
	}
	got, err := signature.NewSecret(bytes.NewReader(seq))
	if err != nil {
		t.Fatal(err)
	}
	const want = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
	if got != want {
		t.Errorf("NewSecret = %q, want %q", got, want)
	}
	key, err := signature.DecodeSecret(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(key, seq[:32]) {
		t.Errorf("DecodeSecret(NewSecret) = %x, want %x", key, seq[:32])
	}

	if _, err := signature.NewSecret(bytes.NewReader(seq[:31])); err == nil {
		t.Error("NewSecret with 31 bytes available: want an error")
	}
}

func TestDecodeSecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		secret  string
		wantLen int // 0: want ErrInvalidSecret
	}{
		{secret: secretA, wantLen: 32},
		{secret: strings.TrimPrefix(secretA, "whsec_"), wantLen: 32},
		{secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", wantLen: 24},
		{secret: "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX", wantLen: 24},
		{secret: "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRY=", wantLen: 0}, // 23 bytes
		{secret: "", wantLen: 0},
		{secret: "whsec_", wantLen: 0},
		{secret: "whsec_!!!notbase64!!!notbase64!!!notbase64", wantLen: 0},
		{secret: "whsec_AQgPFh0kKzI5QEdOVVxjanF4f4aNlJuiqbC3vsXM09o", wantLen: 0},  // missing padding
		{secret: "whsec_AQgPFh0kKzI5QEdOVVxjanF4f4aNlJuiqbC3vsXM09o_", wantLen: 0}, // URL alphabet
	}
	for _, tc := range tests {
		key, err := signature.DecodeSecret(tc.secret)
		switch {
		case tc.wantLen == 0 && !errors.Is(err, signature.ErrInvalidSecret):
			t.Errorf("DecodeSecret(%q) = %d bytes, %v; want ErrInvalidSecret", tc.secret, len(key), err)
		case tc.wantLen != 0 && (err != nil || len(key) != tc.wantLen):
			t.Errorf("DecodeSecret(%q) = %d bytes, %v; want %d bytes", tc.secret, len(key), err, tc.wantLen)
		}
		if rest := strings.TrimPrefix(tc.secret, "whsec_"); err != nil && rest != "" && strings.Contains(err.Error(), rest) {
			t.Errorf("DecodeSecret(%q) error %q leaks the secret", tc.secret, err)
		}
	}
}

// CheckSecret is DecodeSecret with the whsec_ prefix required.
func TestCheckSecret(t *testing.T) {
	t.Parallel()
	if err := signature.CheckSecret(secretA); err != nil {
		t.Errorf("CheckSecret(%q) = %v, want nil", secretA, err)
	}
	for _, bad := range []string{strings.TrimPrefix(secretA, "whsec_"), "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRY=", "", "WHSEC_" + strings.TrimPrefix(secretA, "whsec_")} {
		if err := signature.CheckSecret(bad); !errors.Is(err, signature.ErrInvalidSecret) {
			t.Errorf("CheckSecret(%q) = %v, want ErrInvalidSecret", bad, err)
		}
	}
}

func TestNewSignerRejects(t *testing.T) {
	t.Parallel()
	if _, err := signature.NewSigner(); !errors.Is(err, signature.ErrInvalidSecret) {
		t.Errorf("NewSigner() = %v, want ErrInvalidSecret", err)
	}
	if _, err := signature.NewSigner(secretA, "whsec_AAAA"); !errors.Is(err, signature.ErrInvalidSecret) {
		t.Errorf("NewSigner(valid, short) = %v, want ErrInvalidSecret", err)
	}
}

func TestSignatureAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	s := mustSigner(t, secretA, secretB)
	ts := time.Unix(1700000000, 0)
	body := bytes.Repeat([]byte("x"), 4096)
	s.Signature("evt_1", ts, body) // fill the pools
	// One allocation: the returned string.
	if n := testing.AllocsPerRun(100, func() { s.Signature("evt_1", ts, body) }); n > 1 {
		t.Errorf("Signature allocates %v times per call, want at most 1", n)
	}
}

func BenchmarkSignature(b *testing.B) {
	s := mustSigner(b, secretA)
	ts := time.Unix(1700000000, 0)
	body := bytes.Repeat([]byte("x"), 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		s.Signature("evt_01hf2g0y3z4x5w6v7t8s9r0q1p", ts, body)
	}
}

func FuzzVerify(f *testing.F) {
	for _, v := range loadVectors(f) {
		f.Add(v.Secret, v.ID, v.Timestamp, []byte(v.Body), v.Signature, uint16(0))
	}
	f.Add("", "", int64(-1), []byte(nil), "v1, v1,, v2,x", uint16(7))
	f.Fuzz(func(t *testing.T, secret, id string, unix int64, body []byte, sig string, pos uint16) {
		now := time.Unix(unix, 0)
		h := http.Header{}
		h.Set(signature.HeaderID, id)
		h.Set(signature.HeaderTimestamp, strconv.FormatInt(unix, 10))
		h.Set(signature.HeaderSignature, sig)
		_ = signature.Verify(h, body, now, secret) // must not panic

		s, err := signature.NewSigner(secret)
		if err != nil {
			secret = secretA
			s = mustSigner(t, secret)
		}
		if id == "" {
			id = "evt_1"
		}
		valid := http.Header{}
		s.Set(valid, id, now, body)
		if err := signature.Verify(valid, body, now, secret); err != nil {
			t.Fatalf("our own signature does not verify: %v", err)
		}

		mutated := append([]byte(nil), body...)
		if len(mutated) == 0 {
			mutated = append(mutated, 'x')
		} else {
			mutated[int(pos)%len(mutated)] ^= 1
		}
		if err := signature.Verify(valid, mutated, now, secret); !errors.Is(err, signature.ErrNoMatch) {
			t.Fatalf("mutated body: Verify = %v, want ErrNoMatch", err)
		}

		otherID := []byte(id)
		otherID[int(pos)%len(otherID)] ^= 1
		valid.Set(signature.HeaderID, string(otherID))
		if err := signature.Verify(valid, body, now, secret); !errors.Is(err, signature.ErrNoMatch) {
			t.Fatalf("mutated id: Verify = %v, want ErrNoMatch", err)
		}
	})
}
