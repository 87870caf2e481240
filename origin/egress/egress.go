// Package egress is how the origin reaches subscriber URLs without becoming an
// SSRF proxy into its own network: it validates URLs when subscribers are
// created or changed, and builds the HTTP client deliveries use, which checks
// every address again at dial time because DNS can change in between.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Errors returned by CheckURL and by the Client's dials wrap one of these with
// a short reason. Reasons name the host at most, never the whole URL: its path
// or query may carry a token.
var (
	ErrInvalidURL       = errors.New("egress: invalid URL")
	ErrForbiddenAddress = errors.New("egress: forbidden address")
)

// MaxURLLength is the longest subscriber URL CheckURL accepts, in bytes.
const MaxURLLength = 2048

// Resolver is the part of *net.Resolver CheckURL uses, declared here so tests
// can pass a fake that returns chosen addresses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Policy decides which endpoints are reachable.
type Policy struct {
	AllowPrivate bool     // --allow-private-endpoints: tests and local development
	Resolver     Resolver // nil means net.DefaultResolver
}

func (p Policy) resolver() Resolver {
	if p.Resolver == nil {
		return net.DefaultResolver
	}
	return p.Resolver
}

// CheckURL validates a subscriber URL when it is created or changed: absolute,
// scheme http or https, a host, no userinfo (credentials in URLs leak into
// logs), a port in 1–65535 when one is given, at most MaxURLLength bytes.
// Unless AllowPrivate, the IP literal or every address the name resolves to
// now must be Public; a name that does not resolve is let through, since
// the dialer checks every address again at each attempt.
// It returns an error wrapping ErrInvalidURL or ErrForbiddenAddress, or the
// context's error when ctx ends during the lookup.
func (p Policy) CheckURL(ctx context.Context, raw string) error {
	if len(raw) > MaxURLLength {
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidURL, MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// Not wrapped: *url.Error repeats the whole URL, secrets included.
		return fmt.Errorf("%w: malformed", ErrInvalidURL)
	}
	if !u.IsAbs() {
		return fmt.Errorf("%w: not absolute", ErrInvalidURL)
	}
	if u.Scheme != "http" && u.Scheme != "https" { // url.Parse lower-cases the scheme
		return fmt.Errorf("%w: scheme must be http or https", ErrInvalidURL)
	}
	if u.User != nil {
		return fmt.Errorf("%w: credentials in the URL are not allowed", ErrInvalidURL)
	}
	host := u.Hostname()
	if u.Opaque != "" || host == "" {
		return fmt.Errorf("%w: no host", ErrInvalidURL)
	}
	if !ascii(host) {
		// Check the name net/http will dial: its transport maps a
		// non-ASCII host as IDNA lookup does, and "１２７.０.０.１" or
		// "127。0。0。1" become 127.0.0.1 there.
		if host, err = idna.Lookup.ToASCII(host); err != nil || host == "" {
			return fmt.Errorf("%w: the host is not a valid internationalised domain name", ErrInvalidURL)
		}
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: port out of range", ErrInvalidURL)
		}
	}

	if a, err := netip.ParseAddr(host); err == nil {
		if !p.AllowPrivate && !Public(a) {
			return fmt.Errorf("%w: %s is not a public address", ErrForbiddenAddress, host)
		}
		return nil
	}
	if numericLabel(host) {
		// Browsers and the C library read "2130706433" or "0x7f.1" as
		// 127.0.0.1 while net/netip does not: refuse the ambiguity outright.
		return fmt.Errorf("%w: host %q looks numeric but is not an IP address", ErrInvalidURL, host)
	}
	if p.AllowPrivate {
		return nil
	}
	addrs, err := p.resolver().LookupNetIP(ctx, "ip", host)
	if ctx.Err() != nil {
		return fmt.Errorf("egress: resolving %q: %w", host, ctx.Err())
	}
	if err != nil {
		// A name that does not resolve yet (or a resolver that is down) is
		// no address to refuse: the check at dial time guards every attempt.
		return nil
	}
	for _, a := range addrs {
		// Every address, not the first: the dialer may try any of them, and
		// one private answer among public ones is the classic bypass.
		if !Public(a) {
			return fmt.Errorf("%w: host %q resolves to a non-public address", ErrForbiddenAddress, host)
		}
	}
	return nil
}

func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// numericLabel reports whether host's last label is a decimal or 0x-hex
// number, which no real top-level domain is.
func numericLabel(host string) bool {
	host = strings.TrimSuffix(host, ".")
	last := host[strings.LastIndexByte(host, '.')+1:]
	digits := "0123456789"
	if len(last) > 2 && (last[:2] == "0x" || last[:2] == "0X") {
		last, digits = last[2:], "0123456789abcdefABCDEF"
	}
	return last != "" && strings.Trim(last, digits) == ""
}

// nonPublic4 lists the IPv4 ranges that are not reachable on the public
// internet, or that reach the origin's own network, host or cloud.
// Documentation and benchmarking ranges are refused too: no real subscriber
// lives there, and fake-IP DNS proxies hand out 198.18.0.0/15 for names they
// then route somewhere private.
var nonPublic4 = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"; Linux dials 0.0.0.0 as loopback
	netip.MustParsePrefix("10.0.0.0/8"),      // RFC 1918
	netip.MustParsePrefix("100.64.0.0/10"),   // CGNAT, RFC 6598 (also Alibaba's metadata 100.100.100.200)
	netip.MustParsePrefix("127.0.0.0/8"),     // loopback
	netip.MustParsePrefix("169.254.0.0/16"),  // link-local, incl. cloud metadata 169.254.169.254
	netip.MustParsePrefix("172.16.0.0/12"),   // RFC 1918
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // TEST-NET-1, documentation
	netip.MustParsePrefix("192.168.0.0/16"),  // RFC 1918
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // TEST-NET-2, documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // TEST-NET-3, documentation
	netip.MustParsePrefix("224.0.0.0/4"),     // multicast
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, incl. broadcast 255.255.255.255
}

var (
	// globalUnicast6 is the only IPv6 block allocated for global unicast.
	// Everything outside it — ::, ::1, deprecated IPv4-compatible ::/96,
	// discard 100::/64, local-use NAT64 64:ff9b:1::/48, unique-local
	// fc00::/7 (AWS metadata fd00:ec2::254), link-local fe80::/10, deprecated
	// site-local fec0::/10, multicast ff00::/8 — is refused, except the
	// well-known NAT64 prefix handled below.
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	// nat64 embeds an IPv4 address in its last 32 bits (RFC 6052); the
	// translator dials that address, so it decides.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
	// sixToFour embeds an IPv4 address in bits 16–47 (RFC 3056); a 6to4
	// relay or local tunnel delivers to it, so it decides.
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// nonPublic6 lists the ranges inside 2000::/3 that are not public.
var nonPublic6 = []netip.Prefix{
	// IETF protocol assignments: Teredo 2001::/32 (an obfuscated IPv4
	// inside), benchmarking 2001:2::/48, ORCHID, and a few anycast
	// services — none of them a webhook receiver.
	netip.MustParsePrefix("2001::/23"),
	netip.MustParsePrefix("2001:db8::/32"), // documentation
	netip.MustParsePrefix("3fff::/20"),     // documentation, RFC 9637
}

// Public reports whether an address may be dialled when private endpoints are
// not allowed. IPv4-mapped IPv6 addresses are judged as the IPv4 address they
// carry, NAT64 and 6to4 addresses by the IPv4 address they embed, and an IPv6
// zone is ignored. The zero Addr is not public.
func Public(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	// Prefix.Contains never matches a zoned address, so drop the zone first.
	a = a.WithZone("").Unmap()
	if a.Is4() {
		return public4(a)
	}
	b := a.As16()
	if nat64.Contains(a) {
		return public4(netip.AddrFrom4([4]byte(b[12:16])))
	}
	if !globalUnicast6.Contains(a) {
		return false
	}
	for _, p := range nonPublic6 {
		if p.Contains(a) {
			return false
		}
	}
	if sixToFour.Contains(a) {
		return public4(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return true
}

func public4(a netip.Addr) bool {
	for _, p := range nonPublic4 {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// ConnectTimeout bounds a dial and a TLS handshake: the longest attempt a
// subscriber may ask for (timeout_ms up to 60 s).
const ConnectTimeout = 60 * time.Second

// Client returns the HTTP client deliveries use. It never follows redirects
// (the caller sees the 3xx: following one would let a subscriber point the
// origin anywhere after CheckURL), ignores proxy environment variables (a
// proxy would dial for us and bypass the check), and, unless AllowPrivate,
// checks every address again when it is dialled, refusing with an error
// wrapping ErrForbiddenAddress, because DNS can change between CheckURL and
// the dial (DNS rebinding). It has no overall timeout: the caller bounds each
// attempt with a context deadline. When Resolver is a *net.Resolver, dials
// resolve with it too.
func (p Policy) Client() *http.Client {
	// The attempt's deadline (a subscriber's timeout_ms, up to a minute)
	// ends the attempt, connecting included. The transport finishes a dial
	// it started even after the request gave up (to pool the connection),
	// so the dial and the handshake still need bounds of their own, or an
	// endpoint that accepts and never answers keeps a socket and a
	// goroutine for good: the longest attempt, so none is cut short.
	dialer := &net.Dialer{Timeout: ConnectTimeout, KeepAlive: 30 * time.Second}
	if r, ok := p.Resolver.(*net.Resolver); ok {
		dialer.Resolver = r
	}
	if !p.AllowPrivate {
		dialer.Control = dialControl
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256, // many concurrent deliveries to the same few hosts
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   ConnectTimeout,
			ExpectContinueTimeout: 1 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// dialControl runs after DNS, on the very address about to be connected, so
// neither a rebinding name nor a name with mixed answers gets through.
func dialControl(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot check dial address", ErrForbiddenAddress)
	}
	if !Public(ap.Addr()) {
		return fmt.Errorf("%w: %s is not a public address", ErrForbiddenAddress, ap.Addr())
	}
	return nil
}
