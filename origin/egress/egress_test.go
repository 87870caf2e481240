package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestPublic(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr   string
		public bool
	}{
		// 0.0.0.0/8
		{"0.0.0.0", false},
		{"0.255.255.255", false},
		{"1.0.0.0", true},
		// 10.0.0.0/8
		{"9.255.255.255", true},
		{"10.0.0.0", false},
		{"10.255.255.255", false},
		{"11.0.0.0", true},
		// 100.64.0.0/10 CGNAT
		{"100.63.255.255", true},
		{"100.64.0.0", false},
		{"100.127.255.255", false},
		{"100.128.0.0", true},
		// 127.0.0.0/8
		{"126.255.255.255", true},
		{"127.0.0.1", false},
		{"127.255.255.255", false},
		{"128.0.0.0", true},
		// 169.254.0.0/16 link-local and cloud metadata
		{"169.253.255.255", true},
		{"169.254.0.0", false},
		{"169.254.169.254", false},
		{"169.254.255.255", false},
		{"169.255.0.0", true},
		// 172.16.0.0/12
		{"172.15.255.255", true},
		{"172.16.0.0", false},
		{"172.31.255.255", false},
		{"172.32.0.0", true},
		// 192.0.0.0/24 IETF protocol assignments
		{"191.255.255.255", true},
		{"192.0.0.0", false},
		{"192.0.0.255", false},
		{"192.0.1.0", true},
		// 192.0.2.0/24 documentation
		{"192.0.1.255", true},
		{"192.0.2.1", false},
		{"192.0.3.0", true},
		// 192.168.0.0/16
		{"192.167.255.255", true},
		{"192.168.0.0", false},
		{"192.168.255.255", false},
		{"192.169.0.0", true},
		// 198.18.0.0/15 benchmarking
		{"198.17.255.255", true},
		{"198.18.0.0", false},
		{"198.19.255.255", false},
		{"198.20.0.0", true},
		// 198.51.100.0/24 documentation
		{"198.51.99.255", true},
		{"198.51.100.1", false},
		{"198.51.101.0", true},
		// 203.0.113.0/24 documentation
		{"203.0.112.255", true},
		{"203.0.113.1", false},
		{"203.0.114.0", true},
		// 224.0.0.0/4 multicast, 240.0.0.0/4 reserved and broadcast
		{"223.255.255.255", true},
		{"224.0.0.0", false},
		{"239.255.255.255", false},
		{"240.0.0.0", false},
		{"255.255.255.254", false},
		{"255.255.255.255", false},
		// well-known public
		{"8.8.8.8", true},
		{"1.1.1.1", true},

		// IPv4-mapped IPv6 is judged unmapped.
		{"::ffff:127.0.0.1", false},
		{"::ffff:10.0.0.1", false},
		{"::ffff:169.254.169.254", false},
		{"::ffff:100.64.0.1", false},
		{"::ffff:8.8.8.8", true},

		// Outside 2000::/3 nothing is public (except NAT64 below), so "just
		// outside" ::1, fc00::/7 and fe80::/10 is still refused.
		{"::", false},
		{"::1", false},
		{"::2", false},
		{"::127.0.0.1", false}, // deprecated IPv4-compatible
		{"::8.8.8.8", false},
		{"100::1", false}, // discard-only
		{"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"fc00::", false},
		{"fd00:ec2::254", false}, // AWS metadata over IPv6
		{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"fe80::", false},
		{"fe80::1%eth0", false},
		{"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"fec0::1", false}, // deprecated site-local
		{"ff02::1", false},
		{"ff0e::1", false},
		// 2000::/3 boundaries
		{"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"2000::1", true},
		{"3fff:1000::", true},
		{"4000::", false},
		// NAT64 64:ff9b::/96 is judged by the embedded IPv4 address.
		{"64:ff9b::7f00:1", false},       // 127.0.0.1
		{"64:ff9b::a00:1", false},        // 10.0.0.1
		{"64:ff9b::a9fe:a9fe", false},    // 169.254.169.254
		{"64:ff9b::808:808", true},       // 8.8.8.8
		{"64:ff9b:1::808:808", false},    // local-use NAT64
		{"64:ff9a:ffff::808:808", false}, // just below the prefix
		// 2001::/23 IETF protocol assignments (Teredo, benchmarking, ORCHID)
		{"2001::1", false},
		{"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		{"2001:200::1", true},
		// 2001:db8::/32 and 3fff::/20 documentation
		{"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", true},
		{"2001:db8::1", false},
		{"2001:db9::", true},
		{"3fff::1", false},
		{"3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", false},
		// 6to4 2002::/16 is judged by the embedded IPv4 address.
		{"2002:7f00:1::1", false},   // 127.0.0.1
		{"2002:c0a8:101::1", false}, // 192.168.1.1
		{"2002:808:808::1", true},   // 8.8.8.8
		// well-known public
		{"2606:4700::1", true},
		{"2606:4700::1%eth0", true}, // a zone does not change a global address
		{"2a00:1450:4001:800::200e", true},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		if got := Public(a); got != tt.public {
			t.Errorf("Public(%s) = %v, want %v", tt.addr, got, tt.public)
		}
	}
	if Public(netip.Addr{}) {
		t.Error("Public(zero Addr) = true, want false")
	}
}

// fakeResolver answers from a map; an unknown name does not exist.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	if network != "ip" {
		return nil, errors.New("unexpected network " + network)
	}
	ss, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var addrs []netip.Addr
	for _, s := range ss {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	return addrs, nil
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	resolver := fakeResolver{
		"hooks.example.com":   {"93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"},
		"mixed.example.com":   {"93.184.215.14", "10.0.0.7"},
		"mapped.example.com":  {"::ffff:169.254.169.254"},
		"private.example.com": {"192.168.1.10"},
		"empty.example.com":   {},
	}
	strict := Policy{Resolver: resolver}
	lax := Policy{AllowPrivate: true, Resolver: resolver}
	// exactly MaxURLLength bytes, then one more
	long := "https://8.8.8.8/" + strings.Repeat("a", MaxURLLength-len("https://8.8.8.8/"))

	tests := []struct {
		name   string
		policy Policy
		url    string
		want   error // nil, ErrInvalidURL or ErrForbiddenAddress
	}{
		{"https public literal", strict, "https://8.8.8.8/hooks", nil},
		{"http public v6 literal with port", strict, "http://[2606:4700::1]:8443/x?y=1", nil},
		{"upper-case scheme", strict, "HTTPS://8.8.8.8/", nil},
		{"ftp scheme", strict, "ftp://8.8.8.8/file", ErrInvalidURL},
		{"javascript scheme", strict, "javascript:alert(1)", ErrInvalidURL},
		{"missing host", strict, "https:///path", ErrInvalidURL},
		{"port only", strict, "https://:443/path", ErrInvalidURL},
		{"opaque", strict, "http:8.8.8.8", ErrInvalidURL},
		{"userinfo", strict, "https://user:pass@8.8.8.8/", ErrInvalidURL},
		{"user only", strict, "https://token@8.8.8.8/", ErrInvalidURL},
		{"empty userinfo", strict, "https://@8.8.8.8/", ErrInvalidURL},
		{"relative", strict, "/hooks/1", ErrInvalidURL},
		{"scheme-relative", strict, "//8.8.8.8/hooks", ErrInvalidURL},
		{"empty", strict, "", ErrInvalidURL},
		{"malformed", strict, "https://8.8.8.8:port/", ErrInvalidURL},
		{"port zero", strict, "https://8.8.8.8:0/", ErrInvalidURL},
		{"port too big", strict, "https://8.8.8.8:65536/", ErrInvalidURL},
		{"exactly max length", strict, long, nil},
		{"too long", strict, long + "a", ErrInvalidURL},
		{"decimal host", strict, "http://2130706433/", ErrInvalidURL},
		{"short dotted host", strict, "http://127.1/", ErrInvalidURL},
		{"hex host", strict, "http://0x7f.0x1/", ErrInvalidURL},
		{"fullwidth loopback, as net/http maps it", strict, "http://１２７.０.０.１:8080/", ErrForbiddenAddress},
		{"ideographic dots", strict, "http://127。0。0。1/", ErrForbiddenAddress},
		{"fullwidth private name", strict, "https://ｐｒｉｖａｔｅ.example.com/", ErrForbiddenAddress},
		{"invalid internationalised name", strict, "https://-é.example.com/", ErrInvalidURL},
		{"internationalised public name", strict, "https://bücher.example/", nil},
		{"loopback literal", strict, "http://127.0.0.1:8080/", ErrForbiddenAddress},
		{"metadata literal", strict, "http://169.254.169.254/latest/meta-data/", ErrForbiddenAddress},
		{"private literal", strict, "https://10.1.2.3/", ErrForbiddenAddress},
		{"v6 loopback literal", strict, "http://[::1]/", ErrForbiddenAddress},
		{"mapped loopback literal", strict, "http://[::ffff:127.0.0.1]/", ErrForbiddenAddress},
		{"zoned link-local literal", strict, "http://[fe80::1%25eth0]/", ErrForbiddenAddress},
		{"name resolving public", strict, "https://hooks.example.com/in", nil},
		{"name resolving public and private", strict, "https://mixed.example.com/in", ErrForbiddenAddress},
		{"name resolving mapped metadata", strict, "https://mapped.example.com/", ErrForbiddenAddress},
		{"name resolving private", strict, "https://private.example.com/", ErrForbiddenAddress},
		{"name not resolving (yet): the dialer checks it", strict, "https://nope.example.com/", nil},
		{"name resolving to nothing", strict, "https://empty.example.com/", nil},
		{"allow private loopback literal", lax, "http://127.0.0.1:8080/hooks", nil},
		{"allow private name", lax, "http://private.example.com/", nil},
		{"allow private, name not resolving", lax, "http://nope.example.com/", nil},
		{"allow private still no userinfo", lax, "http://u:p@127.0.0.1/", ErrInvalidURL},
	}
	for _, tt := range tests {
		err := tt.policy.CheckURL(t.Context(), tt.url)
		switch {
		case tt.want == nil && err != nil:
			t.Errorf("%s: CheckURL(%q) = %v, want nil", tt.name, tt.url, err)
		case tt.want != nil && !errors.Is(err, tt.want):
			t.Errorf("%s: CheckURL(%q) = %v, want %v", tt.name, tt.url, err, tt.want)
		}
	}
}

func TestCheckURLErrorsKeepSecretsOut(t *testing.T) {
	t.Parallel()
	p := Policy{Resolver: fakeResolver{"private.example.com": {"192.168.1.10"}}}
	for _, raw := range []string{
		"https://user:s3cret@8.8.8.8/",
		"https://8.8.8.8:bad/?token=s3cret",
		"ftp://8.8.8.8/?token=s3cret",
		"https://10.0.0.1/?token=s3cret",
		"https://private.example.com/?token=s3cret",
	} {
		err := p.CheckURL(t.Context(), raw)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("CheckURL(%q) = %v, want an error without the secret", raw, err)
		}
	}
}

func TestCheckURLReturnsContextError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	p := Policy{Resolver: fakeResolver{}}
	err := p.CheckURL(ctx, "https://hooks.example.com/")
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrInvalidURL) {
		t.Fatalf("CheckURL with a cancelled context = %v, want context.Canceled", err)
	}
}

func TestDialControl(t *testing.T) {
	t.Parallel()
	tests := []struct {
		address string
		ok      bool
	}{
		{"8.8.8.8:443", true},
		{"[2606:4700::1]:443", true},
		{"127.0.0.1:80", false},
		{"10.0.0.1:443", false},
		{"169.254.169.254:80", false},
		{"[::ffff:127.0.0.1]:80", false},
		{"[fe80::1%eth0]:80", false},
		{"not-an-address", false},
	}
	for _, tt := range tests {
		err := dialControl("tcp", tt.address, nil)
		if tt.ok && err != nil {
			t.Errorf("dialControl(%s) = %v, want nil", tt.address, err)
		}
		if !tt.ok && !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("dialControl(%s) = %v, want ErrForbiddenAddress", tt.address, err)
		}
	}
}

// setup starts a receiver on 127.0.0.1 that counts the requests to each path.
func setup(t *testing.T) (srv *httptest.Server, hits map[string]*atomic.Int64) {
	t.Helper()
	hits = map[string]*atomic.Int64{"/hook": {}, "/moved": {}, "/elsewhere": {}}
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		hits["/hook"].Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		hits["/moved"].Add(1)
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
		hits["/elsewhere"].Add(1)
		w.WriteHeader(http.StatusOK)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: mux}}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, hits
}

func post(t *testing.T, c *http.Client, url string) (*http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"type":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

func TestClientRefusesPrivateAddressAtDial(t *testing.T) {
	t.Parallel()
	srv, hits := setup(t)
	c := Policy{}.Client()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	// By IP and by a name resolved at dial time (as after DNS rebinding:
	// CheckURL never saw it).
	for _, url := range []string{srv.URL + "/hook", "http://localhost:" + port + "/hook"} {
		_, err := post(t, c, url)
		if !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("POST %s with private endpoints refused: err = %v, want ErrForbiddenAddress", url, err)
		}
	}
	if n := hits["/hook"].Load(); n != 0 {
		t.Fatalf("receiver was hit %d times, want 0", n)
	}
}

func TestClientAllowsPrivateWhenAllowed(t *testing.T) {
	t.Parallel()
	srv, hits := setup(t)
	resp, err := post(t, Policy{AllowPrivate: true}.Client(), srv.URL+"/hook")
	if err != nil {
		t.Fatalf("POST with private endpoints allowed: %v", err)
	}
	if resp.StatusCode != http.StatusNoContent || hits["/hook"].Load() != 1 {
		t.Fatalf("status %d, hits %d; want 204 and 1", resp.StatusCode, hits["/hook"].Load())
	}
}

func TestClientDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()
	srv, hits := setup(t)
	resp, err := post(t, Policy{AllowPrivate: true}.Client(), srv.URL+"/moved")
	if err != nil {
		t.Fatalf("POST /moved: %v", err)
	}
	if resp.StatusCode != http.StatusFound {
		t.Errorf("status = %d, want 302 handed to the caller", resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); loc != "/elsewhere" {
		t.Errorf("Location = %q, want /elsewhere", loc)
	}
	if n := hits["/moved"].Load(); n != 1 {
		t.Errorf("/moved hit %d times, want 1", n)
	}
	if n := hits["/elsewhere"].Load(); n != 0 {
		t.Errorf("redirect target hit %d times, want 0", n)
	}
}

func TestClientSettings(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{{}, {AllowPrivate: true}} {
		c := p.Client()
		if c.Timeout != 0 {
			t.Errorf("AllowPrivate=%v: Client.Timeout = %v, want none", p.AllowPrivate, c.Timeout)
		}
		tr, ok := c.Transport.(*http.Transport)
		if !ok {
			t.Fatalf("Transport is %T, want *http.Transport", c.Transport)
		}
		if tr.Proxy != nil {
			t.Errorf("AllowPrivate=%v: Proxy is set; proxy environment variables would bypass the dial check", p.AllowPrivate)
		}
		if !tr.ForceAttemptHTTP2 || tr.MaxIdleConns != 1024 || tr.MaxIdleConnsPerHost != 256 ||
			tr.IdleConnTimeout != 90*time.Second || tr.TLSHandshakeTimeout != ConnectTimeout {
			t.Errorf("AllowPrivate=%v: transport tuning = %+v", p.AllowPrivate, tr)
		}
	}
}

// A connect that hangs (the endpoint's accept queue is full and it drops
// SYNs) is bounded by the attempt's deadline alone, however long the
// subscriber allows: here longer than the 5 s a fixed dial timeout cut it to.
func TestAHangingConnectLastsTheAttemptsDeadline(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux's listen backlog, which drops SYNs once full")
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue: nothing accepts, so dials start to hang.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			break
		}
		defer c.Close()
		if i > 64 {
			t.Fatal("the accept queue never filled")
		}
	}
	const deadline = 5500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/hook", strings.NewReader("{}"))
	start := time.Now()
	resp, err := Policy{AllowPrivate: true}.Client().Do(req)
	took := time.Since(start)
	if err == nil {
		resp.Body.Close()
		t.Fatal("the hanging endpoint answered")
	}
	if !errors.Is(err, context.DeadlineExceeded) || took < deadline-100*time.Millisecond {
		t.Fatalf("gave up after %v with %v; want the attempt's deadline, %v", took.Round(time.Millisecond), err, deadline)
	}
}
