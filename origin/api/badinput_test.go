package api_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/origin/api"
)

// badCase is one request the API must refuse without storing anything.
type badCase struct {
	name         string
	method, path string
	body         string
	header       map[string]string // "Authorization": "" sends no token
	config       func(*api.Config)
	// prep builds state the case needs and returns the path to call
	// (replacing path); the snapshot is taken after it.
	prep   func(t *testing.T, b *bundle) string
	status int
	code   string // when set, the exact error code
	// message, when set, must appear in the error message.
	message string
	// absent lists event ids that must not exist afterwards.
	absent []string
}

func maxBody1024(c *api.Config) { c.MaxBody = 1024 }

func batchOf(n int) string {
	ev := make([]string, n)
	for i := range ev {
		ev[i] = fmt.Sprintf(`{"id":"b%d","type":"t.x"}`, i)
	}
	return `{"events":[` + strings.Join(ev, ",") + `]}`
}

var badCases = []badCase{
	// POST /v1/subscribers: unreadable bodies and fields (400).
	{name: "subscriber invalid JSON", method: "POST", path: "/v1/subscribers", body: `{"url":`, status: 400},
	{name: "subscriber JSON array", method: "POST", path: "/v1/subscribers", body: `[{"url":"http://127.0.0.1:9/"}]`, status: 400},
	{name: "subscriber empty body", method: "POST", path: "/v1/subscribers", body: ``, status: 400, code: "invalid_json", message: "the body is empty"},
	{name: "subscriber whitespace body", method: "POST", path: "/v1/subscribers", body: " \n ", status: 400},
	{name: "subscriber unknown field", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","colour":"red"}`, status: 400, message: "colour"},
	{name: "subscriber url missing", method: "POST", path: "/v1/subscribers", body: `{"event_types":["*"]}`, status: 400, message: "url"},
	{name: "subscriber url a number", method: "POST", path: "/v1/subscribers", body: `{"url":42}`, status: 400, message: "url"},
	{name: "subscriber trailing object", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/"} {"id":"x"}`, status: 400},
	{name: "subscriber trailing bracket", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/"}]`, status: 400},
	{name: "subscriber trailing brace", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/"}}`, status: 400},
	{name: "subscriber max_attempts a string", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","max_attempts":"3"}`, status: 400},
	{name: "subscriber field in another case", method: "POST", path: "/v1/subscribers", body: `{"URL":"http://127.0.0.1:9/"}`, status: 400, code: "bad_request", message: `unknown field "URL"`},
	{name: "subscriber id in two cases", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","id":"s_case","ID":"other"}`, status: 400, message: `unknown field "ID"`},
	{name: "subscriber id twice", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","id":"a","id":"b"}`, status: 400, code: "bad_request", message: `"id" must appear only once`},
	{name: "subscriber rate field in another case", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"Per_Second":5}}`, status: 400, message: `unknown field "Per_Second"`},
	{name: "subscriber rate burst twice", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"burst":5,"burst":50}}`, status: 400, message: `"burst" must appear only once`},
	{name: "subscriber long unknown field is cut short", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","` + strings.Repeat("k", 500) + `":1}`, status: 400, message: strings.Repeat("k", 100) + "…\""},
	{name: "subscriber body over 64 KiB", method: "POST", path: "/v1/subscribers",
		body: `{"url":"http://127.0.0.1:9/` + strings.Repeat("a", 64<<10) + `"}`, status: 413},

	// POST /v1/subscribers: readable but unacceptable values (422).
	{name: "subscriber ftp url", method: "POST", path: "/v1/subscribers", body: `{"url":"ftp://127.0.0.1/hook"}`, status: 422, code: "invalid_url", message: "url: invalid URL: scheme must be http or https"},
	{name: "subscriber relative url", method: "POST", path: "/v1/subscribers", body: `{"url":"/hook"}`, status: 422},
	{name: "subscriber url with userinfo", method: "POST", path: "/v1/subscribers", body: `{"url":"http://user:pw@127.0.0.1:9/hook"}`, status: 422},
	{name: "subscriber loopback url denied", method: "POST", path: "/v1/subscribers", config: denyPrivate, body: `{"url":"http://127.0.0.1:9/hook"}`, status: 422},
	{name: "subscriber ipv6 loopback denied", method: "POST", path: "/v1/subscribers", config: denyPrivate, body: `{"url":"http://[::1]:9/hook"}`, status: 422},
	{name: "subscriber localhost denied", method: "POST", path: "/v1/subscribers", config: denyPrivate, body: `{"url":"http://localhost:9/hook"}`, status: 422},
	{name: "subscriber metadata address denied", method: "POST", path: "/v1/subscribers", config: denyPrivate, body: `{"url":"http://169.254.169.254/latest"}`, status: 422},
	{name: "subscriber private address denied", method: "POST", path: "/v1/subscribers", config: denyPrivate, body: `{"url":"http://10.1.2.3/hook"}`, status: 422, code: "invalid_url", message: "10.1.2.3 is not a public address (sluice calls internal addresses only when serve has --allow-private-endpoints)"},
	{name: "subscriber decimal loopback denied", method: "POST", path: "/v1/subscribers", config: denyPrivate, body: `{"url":"http://2130706433/hook"}`, status: 422},
	{name: "subscriber per_second 0", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"per_second":0}}`, status: 422, message: "per_second"},
	{name: "subscriber per_second negative", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"per_second":-5,"burst":10}}`, status: 422, message: "per_second"},
	{name: "subscriber burst 0.5", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"per_second":10,"burst":0.5}}`, status: 422, message: "burst"},
	{name: "subscriber burst 0.5 alone", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"burst":0.5}}`, status: 422, message: "burst"},
	{name: "subscriber max_attempts 0", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","max_attempts":0}`, status: 422, message: "max_attempts"},
	{name: "subscriber max_attempts 101", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","max_attempts":101}`, status: 422, message: "max_attempts"},
	{name: "subscriber timeout_ms 10", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","timeout_ms":10}`, status: 422, message: "timeout_ms"},
	{name: "subscriber max_attempts 1.5", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","max_attempts":1.5}`, status: 422, message: "max_attempts must be a whole number"},
	{name: "subscriber max_attempts beyond int64", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","max_attempts":99999999999999999999}`, status: 422, message: "max_attempts"},
	{name: "subscriber max_attempts 1e400", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","max_attempts":1e400}`, status: 422, message: "max_attempts is out of range"},
	{name: "subscriber rate 1e400", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","rate":{"per_second":1e400}}`, status: 422, message: "rate.per_second is out of range"},
	{name: "subscriber timeout_ms 1e12", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","timeout_ms":1e12}`, status: 422, message: "timeout_ms"},
	{name: "subscriber event_types empty", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","event_types":[]}`, status: 422, message: "event_types"},
	{name: "subscriber event_types bad", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","event_types":["video.trending","bad type!"]}`, status: 422, message: "event_types"},
	{name: "subscriber 101 event_types", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","event_types":["a` + strings.Repeat(`","a`, 100) + `"]}`, status: 422, message: "event_types"},
	{name: "subscriber id with space", method: "POST", path: "/v1/subscribers", body: `{"id":"has space","url":"http://127.0.0.1:9/"}`, status: 422, message: "id"},
	{name: "subscriber id 65 chars", method: "POST", path: "/v1/subscribers", body: `{"id":"` + strings.Repeat("s", 65) + `","url":"http://127.0.0.1:9/"}`, status: 422},
	{name: "subscriber duplicate id", method: "POST", path: "/v1/subscribers", body: `{"id":"catchall","url":"http://127.0.0.1:9/"}`, status: 409},
	{name: "subscriber secret not base64", method: "POST", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/","secret":"hunter2"}`, status: 422, message: "secret"},
	{name: "subscriber secret too short", method: "POST", path: "/v1/subscribers",
		body: `{"url":"http://127.0.0.1:9/","secret":"whsec_` + base64.StdEncoding.EncodeToString(make([]byte, 16)) + `"}`, status: 422, message: "secret"},
	{name: "subscriber secret without whsec_", method: "POST", path: "/v1/subscribers",
		body: `{"url":"http://127.0.0.1:9/","secret":"` + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")) + `"}`, status: 422, message: "secret"},

	// PATCH /v1/subscribers/:id.
	{name: "patch unknown subscriber", method: "PATCH", path: "/v1/subscribers/ghost", body: `{"paused":true}`, status: 404},
	{name: "patch unknown subscriber with a bad url", method: "PATCH", path: "/v1/subscribers/ghost", body: `{"url":"ftp://x"}`, status: 404, code: "not_found"},
	{name: "patch unknown subscriber with bad JSON", method: "PATCH", path: "/v1/subscribers/ghost", body: `{"url":`, status: 404, code: "not_found"},
	{name: "patch loopback url denied", method: "PATCH", path: "/v1/subscribers/catchall", config: denyPrivate, body: `{"url":"http://127.0.0.1:9/hook"}`, status: 422},
	{name: "patch per_second 0", method: "PATCH", path: "/v1/subscribers/catchall", body: `{"rate":{"per_second":0}}`, status: 422},
	{name: "patch id", method: "PATCH", path: "/v1/subscribers/catchall", body: `{"id":"other"}`, status: 400},
	{name: "patch unknown field", method: "PATCH", path: "/v1/subscribers/catchall", body: `{"paused":true,"colour":"red"}`, status: 400},
	{name: "patch trailing brace", method: "PATCH", path: "/v1/subscribers/catchall", body: `{"paused":false}}`, status: 400},
	{name: "delete unknown subscriber", method: "DELETE", path: "/v1/subscribers/ghost", status: 404},
	{name: "patch url twice", method: "PATCH", path: "/v1/subscribers/catchall", body: `{"url":"http://127.0.0.1:9/a","url":"http://127.0.0.1:9/b"}`, status: 400, message: `"url" must appear only once`},
	{name: "patch field in another case", method: "PATCH", path: "/v1/subscribers/catchall", body: `{"Paused":true}`, status: 400, message: `unknown field "Paused"`},
	{name: "patch null", method: "PATCH", path: "/v1/subscribers/catchall", body: `null`, status: 400, message: "object"},
	{name: "subscriber null", method: "POST", path: "/v1/subscribers", body: `null`, status: 400, message: "object"},
	{name: "subscriber invalid UTF-8", method: "POST", path: "/v1/subscribers", body: "{\"url\":\"http://127.0.0.1:9/\xff\"}", status: 400, code: "invalid_json"},

	// POST /v1/subscribers/:id/rotate-secret: the body is optional, but a
	// body given must be right.
	{name: "rotate invalid JSON", method: "POST", path: "/v1/subscribers/catchall/rotate-secret", body: `{bad`, status: 400, code: "invalid_json"},
	{name: "rotate unknown field", method: "POST", path: "/v1/subscribers/catchall/rotate-secret", body: `{"foo":1}`, status: 400, message: "foo"},
	{name: "rotate bad secret", method: "POST", path: "/v1/subscribers/catchall/rotate-secret", body: `{"secret":"hunter2"}`, status: 422, message: "secret"},
	{name: "rotate to the current secret", method: "POST", path: "/v1/subscribers/catchall/rotate-secret", body: `{"secret":"` + catchallSecret + `"}`, status: 422, message: "current"},
	{name: "rotate unknown subscriber", method: "POST", path: "/v1/subscribers/ghost/rotate-secret", status: 404},

	// POST /v1/events.
	{name: "event invalid JSON", method: "POST", path: "/v1/events", body: `{"type":"t.x"`, status: 400},
	{name: "event empty body", method: "POST", path: "/v1/events", body: ``, status: 400, code: "invalid_json", message: "the body is empty"},
	{name: "event JSON array", method: "POST", path: "/v1/events", body: `[{"type":"t.x"}]`, status: 400},
	{name: "event a string", method: "POST", path: "/v1/events", body: `"t.x"`, status: 400},
	{name: "event missing type", method: "POST", path: "/v1/events", body: `{"id":"no-type","data":{}}`, status: 400, message: "type", absent: []string{"no-type"}},
	{name: "event type a number", method: "POST", path: "/v1/events", body: `{"id":"num-type","type":7}`, status: 400, message: "type", absent: []string{"num-type"}},
	{name: "event gzip-encoded", method: "POST", path: "/v1/events", header: map[string]string{"Content-Encoding": "gzip"}, body: `{"id":"gz","type":"t.x"}`,
		status: 415, code: "unsupported_media_type", message: "gzip", absent: []string{"gz"}},
	{name: "batch gzip-encoded", method: "POST", path: "/v1/events/batch", header: map[string]string{"Content-Encoding": "gzip"}, body: `{"events":[{"id":"gzb","type":"t.x"}]}`,
		status: 415, code: "unsupported_media_type", absent: []string{"gzb"}},
	{name: "delivery id not as given", method: "GET", path: "/v1/deliveries/dlv_01", status: 404},
	{name: "cursor not as given", method: "GET", path: "/v1/deliveries?cursor=dlv_0011", status: 400},
	{name: "event type repeated", method: "POST", path: "/v1/events", body: `{"id":"two-types","type":"a.b","type":"c.d"}`, status: 400, absent: []string{"two-types"}},
	{name: "event bad type", method: "POST", path: "/v1/events", body: `{"id":"bad-type","type":"bad type!"}`, status: 422, message: "type", absent: []string{"bad-type"}},
	{name: "event id with space", method: "POST", path: "/v1/events", body: `{"id":"has space","type":"t.x"}`, status: 422, message: "id"},
	{name: "event id 65 chars", method: "POST", path: "/v1/events", body: `{"id":"` + strings.Repeat("e", 65) + `","type":"t.x"}`, status: 422, message: "id"},
	{name: "event id a number", method: "POST", path: "/v1/events", body: `{"id":12,"type":"t.x"}`, status: 400, message: "id"},
	{name: "event invalid UTF-8", method: "POST", path: "/v1/events", body: "{\"id\":\"latin1\",\"type\":\"t.x\",\"name\":\"caf\xe9\"}", status: 400, code: "invalid_json", absent: []string{"latin1"}},
	{name: "batch event invalid UTF-8", method: "POST", path: "/v1/events/batch", body: "{\"events\":[{\"id\":\"u0\",\"type\":\"t.x\"},{\"id\":\"u1\",\"type\":\"t.x\",\"x\":\"\xff\"}]}", status: 400, absent: []string{"u0", "u1"}},
	{name: "event over max-body", method: "POST", path: "/v1/events", config: maxBody1024,
		body: `{"id":"big","type":"t.x","pad":"` + strings.Repeat("x", 1024) + `"}`, status: 413, absent: []string{"big"}},

	// POST /v1/events/batch.
	{name: "batch missing events", method: "POST", path: "/v1/events/batch", body: `{}`, status: 400, message: "events"},
	{name: "batch events null", method: "POST", path: "/v1/events/batch", body: `{"events":null}`, status: 400},
	{name: "batch events an object", method: "POST", path: "/v1/events/batch", body: `{"events":{"type":"t.x"}}`, status: 400},
	{name: "batch invalid JSON", method: "POST", path: "/v1/events/batch", body: `{"events":[`, status: 400},
	{name: "batch trailing brace", method: "POST", path: "/v1/events/batch", body: `{"events":[{"id":"t0","type":"t.x"}]}}`, status: 400, absent: []string{"t0"}},
	{name: "batch events in two cases", method: "POST", path: "/v1/events/batch", body: `{"events":[{"id":"c6","type":"t.x"}],"Events":[{"id":"c7","type":"t.x"}]}`, status: 400, message: `unknown field "Events"`, absent: []string{"c6", "c7"}},
	{name: "batch events twice", method: "POST", path: "/v1/events/batch", body: `{"events":[{"id":"c8","type":"t.x"}],"events":[{"id":"c9","type":"t.x"}]}`, status: 400, message: `"events" must appear only once`, absent: []string{"c8", "c9"}},
	{name: "batch empty list", method: "POST", path: "/v1/events/batch", body: `{"events":[]}`, status: 422},
	{name: "batch 1001 events", method: "POST", path: "/v1/events/batch", body: batchOf(1001), status: 413, message: "1000", absent: []string{"b0", "b1000"}},
	{name: "batch one bad id among good", method: "POST", path: "/v1/events/batch",
		body:   `{"events":[{"id":"g0","type":"t.x"},{"id":"g1","type":"t.x"},{"id":"bad id","type":"t.x"},{"id":"g3","type":"t.x"}]}`,
		status: 422, message: "events[2]", absent: []string{"g0", "g1", "g3"}},
	{name: "batch one without type among good", method: "POST", path: "/v1/events/batch",
		body:   `{"events":[{"id":"h0","type":"t.x"},{"id":"h1"}]}`,
		status: 400, message: "events[1]", absent: []string{"h0"}},
	{name: "batch one not an object among good", method: "POST", path: "/v1/events/batch",
		body:   `{"events":[{"id":"k0","type":"t.x"},{"type":"t.x"},42]}`,
		status: 400, message: "events[2]", absent: []string{"k0"}},
	{name: "batch event over max-body", method: "POST", path: "/v1/events/batch", config: maxBody1024,
		body:   `{"events":[{"id":"m0","type":"t.x"},{"id":"m1","type":"t.x","pad":"` + strings.Repeat("x", 1024) + `"}]}`,
		status: 413, message: "events[1]", absent: []string{"m0", "m1"}},

	// GET /v1/deliveries.
	{name: "deliveries status bogus", method: "GET", path: "/v1/deliveries?status=bogus", status: 422, message: "status"},
	{name: "deliveries limit abc", method: "GET", path: "/v1/deliveries?limit=abc", status: 400, message: "limit"},
	{name: "deliveries limit 0", method: "GET", path: "/v1/deliveries?limit=0", status: 422, message: "limit"},
	{name: "deliveries limit 1001", method: "GET", path: "/v1/deliveries?limit=1001", status: 422, message: "limit"},
	{name: "deliveries cursor garbage", method: "GET", path: "/v1/deliveries?cursor=garbage", status: 400, message: "cursor"},
	{name: "subscribers cursor garbage", method: "GET", path: "/v1/subscribers?cursor=%20no%20such%20id", status: 400, message: "cursor"},
	{name: "delivery unknown", method: "GET", path: "/v1/deliveries/dlv_999999", status: 404},
	{name: "event unknown", method: "GET", path: "/v1/events/nope", status: 404},

	// POST /v1/deliveries/:id/retry.
	{name: "retry unknown delivery", method: "POST", path: "/v1/deliveries/dlv_999999/retry", status: 404},
	{name: "retry malformed delivery id", method: "POST", path: "/v1/deliveries/nope/retry", status: 404},
	{name: "retry sent delivery", method: "POST", status: 409, prep: sentDelivery},

	// POST /v1/subscribers/:id/recover.
	{name: "recover since missing", method: "POST", path: "/v1/subscribers/catchall/recover", body: `{}`, status: 400, message: "since"},
	{name: "recover since yesterday", method: "POST", path: "/v1/subscribers/catchall/recover", body: `{"since":"yesterday"}`, status: 422, message: "since"},
	{name: "recover since twice", method: "POST", path: "/v1/subscribers/catchall/recover", body: `{"since":"2020-01-01T00:00:00Z","since":"2030-01-01T00:00:00Z"}`, status: 400, message: `"since" must appear only once`},
	{name: "recover since in another case", method: "POST", path: "/v1/subscribers/catchall/recover", body: `{"Since":"2020-01-01T00:00:00Z"}`, status: 400, message: `unknown field "Since"`},
	{name: "recover empty body", method: "POST", path: "/v1/subscribers/catchall/recover", body: ``, status: 400, code: "invalid_json", message: "the body is empty"},
	{name: "recover unknown subscriber with a bad since", method: "POST", path: "/v1/subscribers/ghost/recover", body: `{"since":"yesterday"}`, status: 404, code: "not_found"},
	{name: "recover unknown subscriber", method: "POST", path: "/v1/subscribers/ghost/recover", body: `{"since":"2020-01-01T00:00:00Z"}`, status: 404},

	// Routing and auth.
	{name: "unknown route", method: "GET", path: "/v1/nope", status: 404},
	{name: "unknown top-level route", method: "GET", path: "/nope", status: 404},
	{name: "wrong method on subscribers", method: "PUT", path: "/v1/subscribers", body: `{"url":"http://127.0.0.1:9/"}`, status: 405},
	{name: "wrong method on events", method: "DELETE", path: "/v1/events", status: 405},
	{name: "no token", method: "POST", path: "/v1/subscribers", body: `{"id":"sneaky","url":"http://127.0.0.1:9/"}`,
		header: map[string]string{"Authorization": ""}, status: 401, code: "unauthorized"},
	{name: "wrong token", method: "POST", path: "/v1/events", body: `{"id":"sneaky","type":"t.x"}`,
		header: map[string]string{"Authorization": "Bearer not-the-token"}, status: 401, code: "unauthorized", absent: []string{"sneaky"}},
	{name: "token without Bearer", method: "GET", path: "/v1/subscribers",
		header: map[string]string{"Authorization": testToken}, status: 401},
	{name: "basic auth", method: "GET", path: "/v1/deliveries",
		header: map[string]string{"Authorization": "Basic dGVzdDp0ZXN0"}, status: 401},
	{name: "unknown route without a token", method: "GET", path: "/v1/nope",
		header: map[string]string{"Authorization": ""}, status: 401, code: "unauthorized"},
	{name: "wrong method without a token", method: "DELETE", path: "/v1/events",
		header: map[string]string{"Authorization": ""}, status: 401, code: "unauthorized"},
}

// sentDelivery makes a subscriber whose delivery is sent and returns the
// path that retries it.
func sentDelivery(t *testing.T, b *bundle) string {
	rcv := newReceiver(t)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"live","url":%q,"event_types":["live.x"]}`, rcv.url()))
	b.postEvent(t, `{"id":"live-1","type":"live.x"}`, http.StatusAccepted)
	ds := b.deliveries(t, "subscriber_id=live")
	if len(ds) != 1 {
		t.Fatalf("live has deliveries %+v, want one", ds)
	}
	b.waitStatus(t, ds[0].ID, "sent")
	return "/v1/deliveries/" + ds[0].ID + "/retry"
}

// catchallSecret is the secret baseline gives its subscriber.
var catchallSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("catch-all secret of 32 bytes...."))

// baseline stores a paused catch-all subscriber (a public IP literal, so it
// passes a policy that denies private addresses, and paused, so nothing is
// ever sent to it) and one event: any event a bad request stored would add
// a delivery to it.
func baseline(t *testing.T, b *bundle) {
	b.createSubscriber(t, `{"id":"catchall","url":"https://1.1.1.1/hook","paused":true,"secret":"`+catchallSecret+`"}`)
	b.postEvent(t, `{"id":"base","type":"t.x"}`, http.StatusAccepted)
}

// state describes everything stored, as far as the API shows it.
func (b *bundle) state(t *testing.T) []string {
	t.Helper()
	var subs struct {
		Data []subscriberJSON `json:"data"`
	}
	b.do(t, "GET", "/v1/subscribers", "", http.StatusOK, &subs)
	var out []string
	for _, s := range subs.Data {
		out = append(out, fmt.Sprintf("subscriber %s url=%s types=%v rate=%v attempts=%d timeout=%d paused=%v secret=%s updated=%s",
			s.ID, s.URL, s.EventTypes, s.Rate, s.MaxAttempts, s.TimeoutMS, s.Paused, s.Secret, s.UpdatedAt))
	}
	for _, d := range b.deliveries(t, "") {
		out = append(out, fmt.Sprintf("delivery %s event=%s sub=%s status=%s attempts=%d updated=%s",
			d.ID, d.EventID, d.SubscriberID, d.Status, d.AttemptCount, d.UpdatedAt))
	}
	sort.Strings(out)
	return out
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range badCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var opts []func(*api.Config)
			if c.config != nil {
				opts = append(opts, c.config)
			}
			b := setup(t, opts...)
			baseline(t, b)
			path := c.path
			if c.prep != nil {
				path = c.prep(t, b)
			}
			before := b.state(t)

			r := b.call(t, c.method, path, c.body, c.header)
			code, msg := assertError(t, r, c.status)
			if c.code != "" && code != c.code {
				t.Errorf("error code %q, want %q", code, c.code)
			}
			if c.message != "" && !strings.Contains(msg, c.message) {
				t.Errorf("error message %q does not mention %q", msg, c.message)
			}
			if c.status == http.StatusUnauthorized {
				if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("401 without a Bearer WWW-Authenticate challenge (got %q)", got)
				}
			}

			after := b.state(t)
			if !slices.Equal(before, after) {
				t.Errorf("the refused request changed what is stored:\nbefore:\n  %s\nafter:\n  %s",
					strings.Join(before, "\n  "), strings.Join(after, "\n  "))
			}
			for _, id := range c.absent {
				if r := b.call(t, "GET", "/v1/events/"+id, "", nil); r.status != http.StatusNotFound {
					t.Errorf("event %s was stored (GET answers %d: %s)", id, r.status, r.body)
				}
			}
		})
	}
}
