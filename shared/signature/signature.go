// Package signature signs and verifies webhooks the Standard Webhooks way
// (standardwebhooks.com), so that any of its libraries verifies what sluice
// sends, and the edge verifies the origin with the same code.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Header names and limits fixed by the Standard Webhooks spec.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	// Tolerance is the replay window: a timestamp further than this from now,
	// either way, is rejected.
	Tolerance = 5 * time.Minute
	// SecretPrefix marks a secret as a Standard Webhooks signing secret.
	SecretPrefix = "whsec_"
)

// Errors Verify and the secret helpers return, wrapped; match them with errors.Is.
var (
	ErrMissingHeaders = errors.New("signature: missing webhook-id, webhook-timestamp or webhook-signature header")
	ErrInvalidHeaders = errors.New("signature: invalid webhook headers")
	ErrNoMatch        = errors.New("signature: no matching signature")
	ErrTooOld         = errors.New("signature: timestamp too old")
	ErrTooNew         = errors.New("signature: timestamp too new")
	ErrInvalidSecret  = errors.New("signature: invalid secret")
)

const (
	version   = "v1,"
	sigLen    = 44 // base64 of a SHA-256 MAC
	minKeyLen = 24
	newKeyLen = 32
)

// NewSecret returns a fresh signing secret: SecretPrefix followed by the
// standard base64 of 32 bytes read from r (crypto/rand.Reader in production;
// tests pass a fixed reader).
func NewSecret(r io.Reader) (string, error) {
	var key [newKeyLen]byte
	if _, err := io.ReadFull(r, key[:]); err != nil {
		return "", fmt.Errorf("signature: reading random bytes: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(key[:]), nil
}

// CheckSecret validates a secret sluice is given to keep or to sign with:
// DecodeSecret's rules, and the SecretPrefix is required, so every secret
// sluice holds has the one form the design names.
func CheckSecret(secret string) error {
	if !strings.HasPrefix(secret, SecretPrefix) {
		return fmt.Errorf("%w: want %s followed by base64", ErrInvalidSecret, SecretPrefix)
	}
	_, err := DecodeSecret(secret)
	return err
}

// DecodeSecret validates a secret and returns its HMAC key, so that a bad
// secret is refused when it is stored rather than when it is first used.
// The SecretPrefix is optional; the rest must be standard base64 of at least
// 24 bytes. The secret itself never appears in the error.
func DecodeSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil {
		return nil, fmt.Errorf("%w: not standard base64", ErrInvalidSecret)
	}
	if len(key) < minKeyLen {
		return nil, fmt.Errorf("%w: key is %d bytes, want at least %d", ErrInvalidSecret, len(key), minKeyLen)
	}
	return key, nil
}

// Signer signs with one or more secrets: during a rotation the current and
// the previous, so receivers holding either verify. Safe for concurrent use.
type Signer struct {
	keys []*keyedMAC
}

// keyedMAC pools HMAC states for one key, because hmac.New allocates several
// objects and signing runs once per attempt.
type keyedMAC struct {
	pool sync.Pool // of *macState
}

type macState struct {
	mac hash.Hash
	buf []byte // scratch: the "<id>.<timestamp>." prefix, then the sum
}

// NewSigner returns a Signer for secrets, in the order their signatures
// appear in the header. It fails when there is no secret or one is invalid.
func NewSigner(secrets ...string) (*Signer, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret", ErrInvalidSecret)
	}
	s := &Signer{keys: make([]*keyedMAC, len(secrets))}
	for i, secret := range secrets {
		key, err := DecodeSecret(secret)
		if err != nil {
			return nil, fmt.Errorf("secret %d: %w", i+1, err)
		}
		s.keys[i] = &keyedMAC{pool: sync.Pool{New: func() any {
			return &macState{mac: hmac.New(sha256.New, key)}
		}}}
	}
	return s, nil
}

// sum writes the standard base64 of HMAC-SHA256(key, "<id>.<unix>.<body>") into dst.
func (k *keyedMAC) sum(dst *[sigLen]byte, id string, unix int64, body []byte) {
	st := k.pool.Get().(*macState)
	st.buf = encodeMAC(dst, st.mac, st.buf, id, unix, body)
	k.pool.Put(st)
}

// encodeMAC writes the standard base64 of m's MAC of "<id>.<unix>.<body>" into
// dst, using buf as scratch space, and returns buf for reuse.
func encodeMAC(dst *[sigLen]byte, m hash.Hash, buf []byte, id string, unix int64, body []byte) []byte {
	m.Reset()
	buf = append(buf[:0], id...)
	buf = append(buf, '.')
	buf = strconv.AppendInt(buf, unix, 10)
	buf = append(buf, '.')
	m.Write(buf)
	m.Write(body)
	buf = m.Sum(buf[:0])
	base64.StdEncoding.Encode(dst[:], buf)
	return buf
}

// Signature returns the webhook-signature header value: "v1,<base64 MAC>"
// for each secret, space-separated, in the order given to NewSigner.
// A zero Signer returns "".
func (s *Signer) Signature(id string, ts time.Time, body []byte) string {
	unix := ts.Unix()
	var b strings.Builder
	b.Grow(len(s.keys) * (len(version) + sigLen + 1))
	var sig [sigLen]byte
	for i, k := range s.keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		k.sum(&sig, id, unix, body)
		b.WriteString(version)
		b.Write(sig[:])
	}
	return b.String()
}

// Set sets the three Standard Webhooks headers on h for one attempt at ts.
func (s *Signer) Set(h http.Header, id string, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, s.Signature(id, ts, body))
}

// Verify reports whether h carries a valid signature of body by any of
// secrets, with a timestamp within Tolerance of now. It returns nil or an
// error wrapping one of the package's sentinels. Signatures are compared in
// constant time.
func Verify(h http.Header, body []byte, now time.Time, secrets ...string) error {
	if len(secrets) == 0 {
		return fmt.Errorf("%w: no secret to verify with", ErrInvalidSecret)
	}
	keys := make([][]byte, len(secrets))
	for i, secret := range secrets {
		key, err := DecodeSecret(secret)
		if err != nil {
			return fmt.Errorf("secret %d: %w", i+1, err)
		}
		keys[i] = key
	}

	id, tsText, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsText == "" || sigs == "" {
		return ErrMissingHeaders
	}
	unix, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is not an integer", ErrInvalidHeaders, HeaderTimestamp)
	}
	ts := time.Unix(unix, 0)
	if now.Sub(ts) > Tolerance {
		return fmt.Errorf("%w: %s is %s before now", ErrTooOld, HeaderTimestamp, now.Sub(ts))
	}
	if ts.Sub(now) > Tolerance {
		return fmt.Errorf("%w: %s is %s after now", ErrTooNew, HeaderTimestamp, ts.Sub(now))
	}

	want := make([][sigLen]byte, len(keys))
	var buf []byte
	for i, key := range keys {
		buf = encodeMAC(&want[i], hmac.New(sha256.New, key), buf, id, unix, body)
	}
	for rest := sigs; rest != ""; {
		var field string
		field, rest, _ = strings.Cut(rest, " ")
		got, ok := strings.CutPrefix(field, version)
		if !ok {
			continue
		}
		for i := range want {
			if hmac.Equal([]byte(got), want[i][:]) {
				return nil
			}
		}
	}
	return ErrNoMatch
}
