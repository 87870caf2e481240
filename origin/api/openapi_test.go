package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/api"
)

// spec is the OpenAPI document as the server serves it, decoded with
// json.Number so integers and other numbers stay distinguishable.
type spec map[string]any

// specMethods are the OpenAPI path-item fields that name an operation.
var specMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// pathParam is a {param} in an OpenAPI path.
var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// withMetrics gives the API a /metrics handler, so that route is registered
// as it is in production.
func withMetrics(c *api.Config) {
	c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprintln(w, "# no metrics in this test")
	})
}

// smallBody keeps 413 cheap to provoke.
func smallBody(c *api.Config) { c.MaxBody = 1024 }

// fetchSpec GETs /openapi.json without a token and decodes it.
func fetchSpec(t *testing.T, b *bundle) spec {
	t.Helper()
	r := b.call(t, "GET", "/openapi.json", "", map[string]string{"Authorization": ""})
	if r.status != http.StatusOK {
		t.Fatalf("GET /openapi.json without a token: status %d, want 200; body %.200s", r.status, r.body)
	}
	if mt, _, _ := mime.ParseMediaType(r.header.Get("Content-Type")); mt != "application/json" {
		t.Errorf("GET /openapi.json: content-type %q, want application/json", r.header.Get("Content-Type"))
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	var doc spec
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("/openapi.json is not JSON: %v", err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("/openapi.json: openapi is %v, want \"3.1.0\"", doc["openapi"])
	}
	return doc
}

// routeKey is "METHOD /path/{param}" for an echo route: ":id" becomes
// "{id}" and a trailing "*" becomes "{path}", OpenAPI's spelling.
func routeKey(method, path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		switch {
		case strings.HasPrefix(s, ":"):
			segs[i] = "{" + s[1:] + "}"
		case s == "*":
			segs[i] = "{path}"
		}
	}
	return method + " " + strings.Join(segs, "/")
}

// registered lists the routes New registers, without echo's own
// pseudo-methods (the not-found route and the like).
func registered(cfg api.Config) []string {
	var out []string
	for _, r := range api.New(cfg).Routes() {
		// HEAD goes with every GET, as the spec's description says.
		if r.Method == echo.RouteNotFound || r.Method == http.MethodHead || strings.ToUpper(r.Method) != r.Method || strings.Contains(r.Method, "_") {
			continue
		}
		out = append(out, routeKey(r.Method, r.Path))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// operations lists the documented operations as "METHOD /path/{param}".
func (doc spec) operations() []string {
	var out []string
	for path, item := range obj(doc["paths"]) {
		for _, m := range specMethods {
			if _, ok := obj(item)[m]; ok {
				out = append(out, strings.ToUpper(m)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// operation returns the operation object for "METHOD /path".
func (doc spec) operation(key string) map[string]any {
	method, path, _ := strings.Cut(key, " ")
	return obj(obj(obj(doc["paths"])[path])[strings.ToLower(method)])
}

// obj is v as a JSON object, or nil.
func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// resolve follows a "#/…" JSON pointer inside the document.
func (doc spec) resolve(ref string) (any, error) {
	frag, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("%q is not a reference inside the document", ref)
	}
	var cur any = map[string]any(doc)
	for _, tok := range strings.Split(frag, "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: %q is not inside an object", ref, tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("%s: no %q", ref, tok)
		}
	}
	return cur, nil
}

// deref returns v, or what it points to when it is a {"$ref": …} object.
func (doc spec) deref(t *testing.T, v any) map[string]any {
	t.Helper()
	m := obj(v)
	for range 10 {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		target, err := doc.resolve(ref)
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		m = obj(target)
	}
	t.Fatalf("reference cycle at %v", v)
	return nil
}

func TestOpenAPIListsEveryRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, withMetrics)
	doc := fetchSpec(t, b)

	routes, documented := registered(b.cfg), doc.operations()
	if len(routes) < 10 {
		t.Fatalf("api.New registered only %d routes: %v", len(routes), routes)
	}
	for _, r := range routes {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is registered but not in openapi.json", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(routes, d) {
			t.Errorf("openapi.json documents %s, which api.New does not register", d)
		}
	}
}

func TestOpenAPIReferencesResolve(t *testing.T) {
	t.Parallel()
	doc := fetchSpec(t, setup(t))

	var refs int
	var walk func(at string, v any)
	walk = func(at string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				refs++
				if _, err := doc.resolve(ref); err != nil {
					t.Errorf("%s: %v", at, err)
				}
			}
			for k, e := range v {
				walk(at+"/"+k, e)
			}
		case []any:
			for i, e := range v {
				walk(at+"/"+strconv.Itoa(i), e)
			}
		}
	}
	walk("#", map[string]any(doc))
	if refs == 0 {
		t.Fatal("openapi.json has no $ref at all; the walk is broken")
	}

	// Every operation answers something documented, every JSON answer has a
	// schema, and every {param} in a path is declared as a path parameter.
	for _, key := range doc.operations() {
		_, path, _ := strings.Cut(key, " ")
		op := doc.operation(key)
		resp := obj(op["responses"])
		if len(resp) == 0 {
			t.Errorf("%s: no responses", key)
		}
		for code, r := range resp {
			for mt, c := range obj(doc.deref(t, r)["content"]) {
				if schema := obj(c)["schema"]; mt == "application/json" && len(doc.deref(t, schema)) == 0 {
					t.Errorf("%s %s: an application/json answer without a schema", key, code)
				}
			}
		}
		declared := map[string]bool{}
		for _, p := range append(slices.Clone(anySlice(obj(obj(doc["paths"])[path])["parameters"])), anySlice(op["parameters"])...) {
			if p := doc.deref(t, p); p["in"] == "path" && p["required"] == true {
				declared[p["name"].(string)] = true
			}
		}
		for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
			if !declared[m[1]] {
				t.Errorf("%s: path parameter {%s} is not declared (in: path, required: true)", key, m[1])
			}
		}
	}
}

// anySlice is v as a JSON array, or nil.
func anySlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// TestOpenAPISecurityMatchesAuth asks every documented operation without a
// token: exactly the ones documented with bearerAuth, all of /v1, answer 401.
func TestOpenAPISecurityMatchesAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, withMetrics)
	doc := fetchSpec(t, b)
	if s := obj(obj(obj(doc["components"])["securitySchemes"])["bearerAuth"]); s["type"] != "http" || s["scheme"] != "bearer" {
		t.Fatalf("components.securitySchemes.bearerAuth is %v, want http bearer", s)
	}
	for _, key := range doc.operations() {
		method, path, _ := strings.Cut(key, " ")
		secured := false
		for _, req := range anySlice(doc.operation(key)["security"]) {
			if _, ok := obj(req)["bearerAuth"]; ok {
				secured = true
			}
		}
		if strings.HasPrefix(path, "/v1/") && !secured {
			t.Errorf("%s: documented without bearerAuth security", key)
		}
		r := b.call(t, method, pathParam.ReplaceAllString(path, "nope"), "", map[string]string{"Authorization": ""})
		if got := r.status == http.StatusUnauthorized; got != secured {
			t.Errorf("%s without a token: status %d, but bearerAuth documented: %v", key, r.status, secured)
		}
	}
}

// TestOpenAPIMatchesAnswers drives every route through the answers an
// operator sees and checks each against the schema documented for its
// route and status: required members present, no undocumented member,
// types, enums and date-times right.
func TestOpenAPIMatchesAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, withMetrics, smallBody)
	doc := fetchSpec(t, b)
	seen := map[string]bool{}
	check := func(method, path, body string, want int) map[string]any {
		t.Helper()
		r := b.call(t, method, path, body, nil)
		if r.status != want {
			t.Fatalf("%s %s: status %d, want %d; body %s", method, path, r.status, want, r.body)
		}
		key := doc.match(t, method, path)
		seen[key] = true
		return doc.conform(t, key, r)
	}

	ok, failing := newReceiver(t), newReceiver(t)
	failing.setStatus(http.StatusInternalServerError)

	check("POST", "/v1/subscribers", `{"id":"oa-ok","url":"`+ok.url()+`","event_types":["oa.*"]}`, http.StatusCreated)
	check("POST", "/v1/subscribers", `{"id":"oa-fail","url":"`+failing.url()+`","max_attempts":1,"rate":{"per_second":5}}`, http.StatusCreated)
	check("POST", "/v1/subscribers", `{"id":"oa-ok","url":"`+ok.url()+`"}`, http.StatusConflict)
	check("POST", "/v1/subscribers", `{"url":`, http.StatusBadRequest)
	check("POST", "/v1/subscribers", `{"url":"`+ok.url()+`","max_attempts":0}`, http.StatusUnprocessableEntity)
	check("POST", "/v1/subscribers", `{"url":"`+ok.url()+`","secret":"`+strings.Repeat("x", 64<<10)+`"}`, http.StatusRequestEntityTooLarge)
	if page := check("GET", "/v1/subscribers?limit=1", "", http.StatusOK); page["next_cursor"] == nil {
		t.Errorf("GET /v1/subscribers?limit=1 of 2: no next_cursor in %v", page)
	}
	check("GET", "/v1/subscribers?limit=x", "", http.StatusBadRequest)
	check("GET", "/v1/subscribers?limit=0", "", http.StatusUnprocessableEntity)
	check("GET", "/v1/subscribers/oa-ok", "", http.StatusOK)
	check("GET", "/v1/subscribers/nope", "", http.StatusNotFound)
	check("PATCH", "/v1/subscribers/oa-ok", `{"paused":false,"timeout_ms":2000}`, http.StatusOK)
	check("PATCH", "/v1/subscribers/oa-ok", `{"secret":"whsec_x"}`, http.StatusBadRequest)
	check("PATCH", "/v1/subscribers/oa-ok", `{"rate":{"per_second":-1}}`, http.StatusUnprocessableEntity)
	check("PATCH", "/v1/subscribers/oa-ok", `{"url":"`+strings.Repeat("x", 64<<10)+`"}`, http.StatusRequestEntityTooLarge)
	check("PATCH", "/v1/subscribers/nope", `{"paused":true}`, http.StatusNotFound)
	if sub := check("POST", "/v1/subscribers/oa-ok/rotate-secret", "", http.StatusOK); sub["previous_secret_expires_at"] == nil {
		t.Errorf("rotate-secret answered no previous_secret_expires_at: %v", sub)
	}
	check("POST", "/v1/subscribers/oa-ok/rotate-secret", `{"secret":"whsec_`+strings.Repeat("QUFB", 8)+`"}`, http.StatusOK)
	check("POST", "/v1/subscribers/oa-ok/rotate-secret", `{"secret":`, http.StatusBadRequest)
	check("POST", "/v1/subscribers/oa-ok/rotate-secret", `{"secret":"whsec_short"}`, http.StatusUnprocessableEntity)
	check("POST", "/v1/subscribers/nope/rotate-secret", "", http.StatusNotFound)

	check("POST", "/v1/events", `{"type":"oa.created","id":"evt-oa-1","n":1}`, http.StatusAccepted)
	check("POST", "/v1/events", `{"type":"oa.created","id":"evt-oa-1","n":1}`, http.StatusOK)
	check("POST", "/v1/events", `{"id":"evt-oa-2"}`, http.StatusBadRequest)
	check("POST", "/v1/events", `{"type":"no spaces"}`, http.StatusUnprocessableEntity)
	check("POST", "/v1/events", `{"type":"oa.big","pad":"`+strings.Repeat("x", 2000)+`"}`, http.StatusRequestEntityTooLarge)
	check("POST", "/v1/events/batch", `{"events":[{"type":"oa.batched"},{"type":"oa.created","id":"evt-oa-1"}]}`, http.StatusAccepted)
	check("POST", "/v1/events/batch", `{"events":{}}`, http.StatusBadRequest)
	check("POST", "/v1/events/batch", `{"events":[]}`, http.StatusUnprocessableEntity)
	check("POST", "/v1/events/batch", `{"events":[{"type":"oa.big","pad":"`+strings.Repeat("x", 2000)+`"}]}`, http.StatusRequestEntityTooLarge)
	ev := check("GET", "/v1/events/evt-oa-1", "", http.StatusOK)
	check("GET", "/v1/events/nope", "", http.StatusNotFound)

	var sentID, deadID string
	for _, d := range anySlice(ev["deliveries"]) {
		switch id, _ := obj(d)["id"].(string); obj(d)["subscriber_id"] {
		case "oa-ok":
			sentID = id
		case "oa-fail":
			deadID = id
		}
	}
	if sentID == "" || deadID == "" {
		t.Fatalf("event evt-oa-1 has deliveries %v, want one to oa-ok and one to oa-fail", ev["deliveries"])
	}
	b.waitStatus(t, sentID, "sent")
	b.waitStatus(t, deadID, "dead")

	check("GET", "/v1/deliveries/"+sentID, "", http.StatusOK)
	if d := check("GET", "/v1/deliveries/"+deadID, "", http.StatusOK); len(anySlice(d["attempts"])) == 0 {
		t.Errorf("dead delivery %s has no attempts: %v", deadID, d)
	}
	check("GET", "/v1/deliveries/nope", "", http.StatusNotFound)
	if page := check("GET", "/v1/deliveries?limit=1", "", http.StatusOK); page["next_cursor"] == nil {
		t.Errorf("GET /v1/deliveries?limit=1: no next_cursor in %v", page)
	}
	check("GET", "/v1/deliveries?status=dead&subscriber_id=oa-fail", "", http.StatusOK)
	check("GET", "/v1/deliveries?cursor=nonsense", "", http.StatusBadRequest)
	check("GET", "/v1/deliveries?status=lost", "", http.StatusUnprocessableEntity)
	check("GET", "/v1/stats", "", http.StatusOK)

	check("POST", "/v1/deliveries/"+sentID+"/retry", "", http.StatusConflict)
	check("POST", "/v1/deliveries/nope/retry", "", http.StatusNotFound)
	check("POST", "/v1/deliveries/"+deadID+"/retry", "", http.StatusOK)
	b.waitStatus(t, deadID, "dead")
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	check("POST", "/v1/subscribers/oa-fail/recover", `{"since":"`+since+`"}`, http.StatusOK)
	check("POST", "/v1/subscribers/oa-fail/recover", `{}`, http.StatusBadRequest)
	check("POST", "/v1/subscribers/oa-fail/recover", `{"since":"yesterday"}`, http.StatusUnprocessableEntity)
	check("POST", "/v1/subscribers/oa-fail/recover", `{"since":"`+strings.Repeat("x", 64<<10)+`"}`, http.StatusRequestEntityTooLarge)
	check("POST", "/v1/subscribers/nope/recover", `{"since":"`+since+`"}`, http.StatusNotFound)
	// After the attempts, stats carry numbers where they carried nulls.
	check("GET", "/v1/stats", "", http.StatusOK)

	check("DELETE", "/v1/subscribers/oa-ok", "", http.StatusNoContent)
	check("DELETE", "/v1/subscribers/oa-ok", "", http.StatusNotFound)
	check("GET", "/healthz", "", http.StatusOK)
	check("GET", "/metrics", "", http.StatusOK)
	check("GET", "/openapi.json", "", http.StatusOK)
	check("GET", "/status", "", http.StatusOK)
	check("GET", "/status/app.js", "", http.StatusOK)
	check("GET", "/status/style.css", "", http.StatusOK)

	for _, key := range doc.operations() {
		if !seen[key] {
			t.Errorf("%s: no answer of it was checked against the document", key)
		}
	}
}

// match finds the documented "METHOD /path/{param}" a request path falls
// under, preferring literal segments over parameters as echo does.
func (doc spec) match(t *testing.T, method, rawPath string) string {
	t.Helper()
	path, _, _ := strings.Cut(rawPath, "?")
	got := strings.Split(path, "/")
	best, bestParams := "", len(got)+1
	for p, item := range obj(doc["paths"]) {
		if _, ok := obj(item)[strings.ToLower(method)]; !ok {
			continue
		}
		segs := strings.Split(p, "/")
		if len(segs) != len(got) {
			continue
		}
		params := 0
		for i, s := range segs {
			if strings.HasPrefix(s, "{") {
				params++
			} else if s != got[i] {
				params = -1
				break
			}
		}
		if params >= 0 && params < bestParams {
			best, bestParams = p, params
		}
	}
	if best == "" {
		t.Fatalf("%s %s: not documented in openapi.json", method, path)
	}
	return method + " " + best
}

// conform checks an answer against the document: its status is listed for
// the operation, with the answer's media type, and a JSON body matches the
// schema. It returns the decoded body when it is a JSON object.
func (doc spec) conform(t *testing.T, key string, r response) map[string]any {
	t.Helper()
	resp, ok := obj(doc.operation(key)["responses"])[strconv.Itoa(r.status)]
	if !ok {
		t.Errorf("%s answered %d, which openapi.json does not list", key, r.status)
		return nil
	}
	content := obj(doc.deref(t, resp)["content"])
	if len(r.body) == 0 {
		if len(content) > 0 {
			t.Errorf("%s %d: empty body, but openapi.json documents %v", key, r.status, content)
		}
		return nil
	}
	mt, _, _ := mime.ParseMediaType(r.header.Get("Content-Type"))
	media, ok := content[mt]
	if !ok {
		t.Errorf("%s %d: content-type %q is not documented (%v)", key, r.status, mt, content)
		return nil
	}
	if mt != "application/json" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Errorf("%s %d: body is not JSON: %v", key, r.status, err)
		return nil
	}
	for _, p := range doc.validate(t, obj(media)["schema"], v, "body") {
		t.Errorf("%s %d: %s\n\tbody: %.500s", key, r.status, p, r.body)
	}
	m, _ := v.(map[string]any)
	return m
}

// validate checks v against a schema of the subset openapi.json uses:
// $ref, allOf, type (one or a list), const, enum, properties, required,
// additionalProperties, items, minItems, maxItems, minimum,
// exclusiveMinimum, maximum, pattern and format date-time. Any other
// keyword is a problem, so none is ignored without anyone noticing. In a
// schema that lists properties, a member it does not declare is a problem
// unless additionalProperties is true: an undocumented field is a
// documentation bug.
func (doc spec) validate(t *testing.T, schemaV any, v any, at string) []string {
	t.Helper()
	s := doc.flatten(t, schemaV)
	var probs []string
	for k := range s {
		if !schemaKeywords[k] {
			probs = append(probs, fmt.Sprintf("%s: the schema uses %q, which this check does not know", at, k))
		}
	}
	if n, ok := v.(json.Number); ok {
		f, _ := n.Float64()
		if m, ok := number(s["minimum"]); ok && f < m {
			probs = append(probs, fmt.Sprintf("%s: %v is below the minimum %v", at, n, m))
		}
		if m, ok := number(s["exclusiveMinimum"]); ok && f <= m {
			probs = append(probs, fmt.Sprintf("%s: %v is not above %v", at, n, m))
		}
		if m, ok := number(s["maximum"]); ok && f > m {
			probs = append(probs, fmt.Sprintf("%s: %v is above the maximum %v", at, n, m))
		}
	}
	if str, ok := v.(string); ok {
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			probs = append(probs, fmt.Sprintf("%s: %q does not match %s", at, str, p))
		}
	}
	if list, ok := v.([]any); ok {
		if m, ok := number(s["minItems"]); ok && float64(len(list)) < m {
			probs = append(probs, fmt.Sprintf("%s: %d items, want at least %v", at, len(list), m))
		}
		if m, ok := number(s["maxItems"]); ok && float64(len(list)) > m {
			probs = append(probs, fmt.Sprintf("%s: %d items, want at most %v", at, len(list), m))
		}
	}
	if types := typeList(s["type"]); len(types) > 0 && !slices.Contains(types, jsonType(v)) &&
		!(jsonType(v) == "integer" && slices.Contains(types, "number")) {
		return []string{fmt.Sprintf("%s: %s, want %s", at, jsonType(v), strings.Join(types, " or "))}
	}
	if c, ok := s["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		probs = append(probs, fmt.Sprintf("%s: %v, want %v", at, v, c))
	}
	if e, ok := s["enum"].([]any); ok && !slices.ContainsFunc(e, func(x any) bool { return fmt.Sprint(x) == fmt.Sprint(v) }) {
		probs = append(probs, fmt.Sprintf("%s: %v is not one of %v", at, v, e))
	}
	if str, ok := v.(string); ok && s["format"] == "date-time" {
		if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
			probs = append(probs, fmt.Sprintf("%s: %q is not an RFC 3339 date-time", at, str))
		}
	}
	switch v := v.(type) {
	case map[string]any:
		props := obj(s["properties"])
		for _, r := range anySlice(s["required"]) {
			if _, ok := v[r.(string)]; !ok {
				probs = append(probs, fmt.Sprintf("%s: required member %q is missing", at, r))
			}
		}
		for k, e := range v {
			if ps, ok := props[k]; ok {
				probs = append(probs, doc.validate(t, ps, e, at+"."+k)...)
			} else if props != nil && s["additionalProperties"] != true {
				probs = append(probs, fmt.Sprintf("%s: member %q is not documented", at, k))
			}
		}
	case []any:
		for i, e := range v {
			probs = append(probs, doc.validate(t, s["items"], e, at+"["+strconv.Itoa(i)+"]")...)
		}
	}
	return probs
}

// number reads a numeric keyword of the spec, decoded with UseNumber.
func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

// schemaKeywords are the keywords validate checks, and the annotations
// that constrain nothing.
var schemaKeywords = map[string]bool{
	"type": true, "const": true, "enum": true, "properties": true, "required": true,
	"additionalProperties": true, "items": true, "minItems": true, "maxItems": true,
	"minimum": true, "exclusiveMinimum": true, "maximum": true, "pattern": true, "format": true,
	"description": true, "default": true, "examples": true,
}

// flatten resolves $ref and merges allOf into one schema: properties and
// required are unioned, other keywords taken from the first that has them.
func (doc spec) flatten(t *testing.T, v any) map[string]any {
	t.Helper()
	s := doc.deref(t, v)
	parts, ok := s["allOf"].([]any)
	if !ok {
		return s
	}
	out := map[string]any{}
	props := map[string]any{}
	var required []any
	for _, p := range parts {
		f := doc.flatten(t, p)
		for k, e := range obj(f["properties"]) {
			props[k] = e
		}
		required = append(required, anySlice(f["required"])...)
		for k, e := range f {
			if _, ok := out[k]; !ok && k != "properties" && k != "required" {
				out[k] = e
			}
		}
	}
	out["properties"], out["required"] = props, required
	return out
}

func typeList(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, e.(string))
		}
		return out
	}
	return nil
}

func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if _, err := v.Int64(); err == nil {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
