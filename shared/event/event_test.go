package event_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/event"
)

const generatedID = "evt_01hf7yat3v041061050r3gg28a"

func fixedID() string { return generatedID }

func TestParse(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 64)
	tests := []struct {
		name      string
		body      string
		wantID    string
		wantType  string
		wantBody  string // "" means the input unchanged
		generated bool
		wantErr   string // exact Error() of a *FieldError or a sentinel
	}{
		{name: "with id", body: `{"id":"evt_1","type":"video.trending","data":{}}`, wantID: "evt_1", wantType: "video.trending"},
		{name: "id of 64 characters", body: `{"type":"a","id":"` + long + `"}`, wantID: long, wantType: "a"},
		{name: "escaped id and type", body: `{"id":"evt\u005f1","\u0074ype":"a\u002eb"}`, wantID: "evt_1", wantType: "a.b"},
		{name: "generated id", body: `{"type":"video.trending"}`, wantID: generatedID, wantType: "video.trending",
			wantBody: `{"id":"` + generatedID + `","type":"video.trending"}`, generated: true},
		{name: "nested id is not the event's", body: `{"type":"a","data":{"id":"x","list":[{"id":1}]}}`, wantID: generatedID, wantType: "a",
			wantBody: `{"id":"` + generatedID + `","type":"a","data":{"id":"x","list":[{"id":1}]}}`, generated: true},
		{name: "id inside a string is not a member", body: `{"type":"a","note":"\"id\":\"x\", \\"}`, wantID: generatedID, wantType: "a",
			wantBody: `{"id":"` + generatedID + `","type":"a","note":"\"id\":\"x\", \\"}`, generated: true},
		{name: "names are case-sensitive", body: `{"ID":"abc","type":"a"}`, wantID: generatedID, wantType: "a",
			wantBody: `{"id":"` + generatedID + `","ID":"abc","type":"a"}`, generated: true},

		{name: "empty body", body: ``, wantErr: event.ErrInvalidJSON.Error()},
		{name: "invalid JSON", body: `{"type":"a"`, wantErr: event.ErrInvalidJSON.Error()},
		{name: "two objects", body: `{"type":"a"}{"type":"b"}`, wantErr: event.ErrInvalidJSON.Error()},
		{name: "broken array", body: `[1,`, wantErr: event.ErrInvalidJSON.Error()},
		{name: "invalid UTF-8 in a string", body: "{\"type\":\"a\",\"name\":\"caf\xe9\"}", wantErr: event.ErrInvalidJSON.Error()},
		{name: "array", body: ` [{"type":"a"}]`, wantErr: event.ErrNotObject.Error()},
		{name: "string", body: `"a"`, wantErr: event.ErrNotObject.Error()},
		{name: "number", body: `42`, wantErr: event.ErrNotObject.Error()},
		{name: "null", body: `null`, wantErr: event.ErrNotObject.Error()},
		{name: "empty object", body: `{}`, wantErr: "type: is required"},
		{name: "missing type", body: `{"id":"evt_1","data":{"type":"a"}}`, wantErr: "type: is required"},
		{name: "type in other case", body: `{"Type":"a"}`, wantErr: "type: is required"},
		{name: "empty type", body: `{"type":""}`, wantErr: "type: must be 1 to 128 characters of A-Z a-z 0-9 _ . : -"},
		{name: "type too long", body: `{"type":"` + strings.Repeat("t", 129) + `"}`, wantErr: "type: must be 1 to 128 characters of A-Z a-z 0-9 _ . : -"},
		{name: "numeric type", body: `{"type":42}`, wantErr: "type: must be a string"},
		{name: "null type", body: `{"type":null}`, wantErr: "type: must be a string"},
		{name: "object type", body: `{"type":{"name":"a"}}`, wantErr: "type: must be a string"},
		{name: "repeated type", body: `{"type":"a","type":"b"}`, wantErr: "type: must appear only once"},
		{name: "id too long", body: `{"type":"a","id":"` + long + `b"}`, wantErr: "id: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"},
		{name: "id with a space", body: `{"type":"a","id":"evt 1"}`, wantErr: "id: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"},
		{name: "empty id", body: `{"type":"a","id":""}`, wantErr: "id: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"},
		{name: "null id", body: `{"type":"a","id":null}`, wantErr: "id: must be a string"},
		{name: "numeric id", body: `{"type":"a","id":7}`, wantErr: "id: must be a string"},
		{name: "repeated id", body: `{"id":"a","type":"t","id":"b"}`, wantErr: "id: must appear only once"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := []byte(tc.body)
			got, err := event.Parse(body, fixedID)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Parse error = %v, want %q", err, tc.wantErr)
				}
				var fe *event.FieldError
				isField := errors.As(err, &fe)
				isSentinel := errors.Is(err, event.ErrInvalidJSON) || errors.Is(err, event.ErrNotObject)
				if isField == isSentinel {
					t.Fatalf("Parse error %v: want exactly one of *FieldError or a sentinel", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := event.Parsed{ID: tc.wantID, Type: tc.wantType, Body: body, Generated: tc.generated}
			if tc.wantBody != "" {
				want.Body = []byte(tc.wantBody)
			}
			if got.ID != want.ID || got.Type != want.Type || got.Generated != want.Generated || !bytes.Equal(got.Body, want.Body) {
				t.Fatalf("Parse = %+v (body %s), want %+v (body %s)", got, got.Body, want, want.Body)
			}
			if !tc.generated && &got.Body[0] != &body[0] {
				t.Error("Parse copied a body that needed no id")
			}
		})
	}
}

func TestParseGivenIDDoesNotGenerate(t *testing.T) {
	t.Parallel()
	_, err := event.Parse([]byte(`{"id":"evt_1","type":"a"}`), func() string {
		t.Error("newID called for an event that has an id")
		return generatedID
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestParseRejectsInvalidGeneratedID(t *testing.T) {
	t.Parallel()
	_, err := event.Parse([]byte(`{"type":"a"}`), func() string { return `x","type":"b` })
	if err == nil {
		t.Fatal("Parse spliced an invalid generated id into the body")
	}
}

func TestParseInsertKeepsEveryOtherByte(t *testing.T) {
	t.Parallel()
	prefix := " \r\n\t{"
	rest := " \n  \"type\" :\t\"comment.created\" ,\r\n\"text\" : \"h\u00e9llo \u4e16\u754c \U0001F389 \\u00e9 \\n\", \"n\":[1 , 2.50e3,true,null] }\n\t"
	got, err := event.Parse([]byte(prefix+rest), fixedID)
	if err != nil {
		t.Fatal(err)
	}
	want := prefix + `"id":"` + generatedID + `",` + rest
	if string(got.Body) != want {
		t.Fatalf("body\n got %q\nwant %q", got.Body, want)
	}
	if !got.Generated || got.ID != generatedID || got.Type != "comment.created" {
		t.Fatalf("Parse = %+v", got)
	}

	// The result is itself a valid event carrying the generated id.
	again, err := event.Parse(got.Body, fixedID)
	if err != nil || again.Generated || again.ID != generatedID {
		t.Fatalf("Parse(result) = %+v, %v; want the generated id, given", again, err)
	}
	var fields map[string]any
	if err := json.Unmarshal(got.Body, &fields); err != nil || fields["id"] != generatedID {
		t.Fatalf("encoding/json reads id %v, err %v", fields["id"], err)
	}
}

func TestNewID(t *testing.T) {
	t.Parallel()
	seq := bytes.NewReader([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	got := event.NewID("evt", time.UnixMilli(1700000000123), seq)
	if got != generatedID {
		t.Errorf("NewID = %q, want %q", got, generatedID)
	}
	if !event.ValidID(got) {
		t.Errorf("NewID = %q is not a ValidID", got)
	}

	zeros := bytes.NewReader(make([]byte, 10))
	if got := event.NewID("sub", time.UnixMilli(1700000000124), zeros); got != "sub_01hf7yat3w0000000000000000" {
		t.Errorf("NewID = %q, want sub_01hf7yat3w0000000000000000", got)
	}
}

func TestNewIDSortsByTime(t *testing.T) {
	t.Parallel()
	start := time.UnixMilli(1700000000000)
	ones := bytes.Repeat([]byte{0xff}, 10)
	var ids []string
	// Later ids get smaller random parts, so only the time can order them.
	for i := range 64 {
		random := bytes.NewReader(bytes.Repeat([]byte{byte(255 - i)}, 10))
		ids = append(ids, event.NewID("dlv", start.Add(time.Duration(i*i)*time.Millisecond), random))
	}
	ids = append(ids, event.NewID("dlv", start.Add(100*time.Hour), bytes.NewReader(make([]byte, 10))))
	if !slices.IsSorted(ids) {
		t.Errorf("ids made at increasing times are not sorted: %q", ids)
	}
	if a, b := event.NewID("dlv", start, bytes.NewReader(ones)), event.NewID("dlv", start, bytes.NewReader(ones)); a != b {
		t.Errorf("same time and randomness gave %q and %q", a, b)
	}
}

func TestNewIDPanicsWhenRandomnessFails(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("NewID with a short reader did not panic")
		}
	}()
	event.NewID("evt", time.UnixMilli(0), bytes.NewReader(make([]byte, 9)))
}

func TestValidIDAndType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s       string
		id, typ bool
	}{
		{"a", true, true},
		{"evt_01hf7yat3v041061050r3gg28a", true, true},
		{"AZaz09_.:-", true, true},
		{strings.Repeat("x", 64), true, true},
		{strings.Repeat("x", 65), false, true},
		{strings.Repeat("x", 128), false, true},
		{strings.Repeat("x", 129), false, false},
		{"", false, false},
		{"a b", false, false},
		{"a/b", false, false},
		{"a*", false, false},
		{"é", false, false},
		{"a\x00", false, false},
		{"a\"", false, false},
	}
	for _, tc := range tests {
		if got := event.ValidID(tc.s); got != tc.id {
			t.Errorf("ValidID(%q) = %v, want %v", tc.s, got, tc.id)
		}
		if got := event.ValidType(tc.s); got != tc.typ {
			t.Errorf("ValidType(%q) = %v, want %v", tc.s, got, tc.typ)
		}
	}
}

func TestMatchType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		patterns []string
		typ      string
		want     bool
	}{
		{[]string{"*"}, "video.trending", true},
		{[]string{"video.*"}, "video.trending", true},
		{[]string{"video.*"}, "video.a.b", true},
		{[]string{"video.*"}, "video", false},
		{[]string{"video.*"}, "videos.trending", false},
		{[]string{"video.*"}, "audio.video.x", false},
		{[]string{"video.trending"}, "video.trending", true},
		{[]string{"video.trending"}, "video.trending.daily", false},
		{[]string{"video.trend"}, "video.trending", false},
		{[]string{"Video.trending"}, "video.trending", false},
		{[]string{"audio.*", "video.trending"}, "video.trending", true},
		{[]string{"audio.*", "comment.created"}, "video.trending", false},
		{nil, "video.trending", false},
	}
	for _, tc := range tests {
		if got := event.MatchType(tc.patterns, tc.typ); got != tc.want {
			t.Errorf("MatchType(%q, %q) = %v, want %v", tc.patterns, tc.typ, got, tc.want)
		}
	}
}

func TestValidPattern(t *testing.T) {
	t.Parallel()
	tests := []struct {
		p    string
		want bool
	}{
		{"*", true},
		{"video.trending", true},
		{"video.*", true},
		{"a.b.*", true},
		{strings.Repeat("t", 128) + ".*", true},
		{"", false},
		{".*", false},
		{"video*", false},
		{"video.**", false},
		{"*.trending", false},
		{"video .*", false},
		{"**", false},
	}
	for _, tc := range tests {
		if got := event.ValidPattern(tc.p); got != tc.want {
			t.Errorf("ValidPattern(%q) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func BenchmarkParse(b *testing.B) {
	body := []byte(`{"type":"video.trending","data":{"video_id":"v_123","views":1048576,"tags":["a","b","c"],"title":"A fairly ordinary title \u00e9"},"occurred_at":"2024-01-02T03:04:05Z"}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := event.Parse(body, fixedID); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParse checks Parse against encoding/json's reading of the same body:
// whatever Parse accepts, a receiver's parser sees with the same id and type.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"type":"a"}`, `{"id":"evt_1","type":"a.b"}`, ` {"type" : "a", "data":{"id":[1,{"x":"}"}]}} `,
		`{"\u0069d":"x","type":"a"}`, `{"type":"a","ID":"b"}`, `{"type":"a","id":null}`, `[]`, `{`, `{"type":"a\"b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		input := bytes.Clone(body)
		p, err := event.Parse(body, fixedID)
		if !bytes.Equal(body, input) {
			t.Fatal("Parse modified its input")
		}
		var fields map[string]any
		jsonErr := json.Unmarshal(body, &fields)
		var fe *event.FieldError
		switch {
		case errors.Is(err, event.ErrInvalidJSON):
			if json.Valid(body) {
				t.Fatal("ErrInvalidJSON for valid JSON")
			}
			return
		case errors.Is(err, event.ErrNotObject):
			if jsonErr == nil && fields != nil {
				t.Fatal("ErrNotObject for an object")
			}
			return
		case errors.As(err, &fe):
			if jsonErr != nil {
				t.Fatalf("FieldError %v for a body encoding/json rejects: %v", err, jsonErr)
			}
			if fe.Reason == "is required" {
				if _, ok := fields[fe.Field]; ok {
					t.Fatalf("%v, but encoding/json sees %q", err, fe.Field)
				}
			}
			return
		case err != nil:
			t.Fatalf("unexpected error %v", err)
		}

		fields = nil
		if err := json.Unmarshal(p.Body, &fields); err != nil {
			t.Fatalf("Parse returned a body encoding/json rejects: %v\n%q", err, p.Body)
		}
		if fields["id"] != p.ID || fields["type"] != p.Type {
			t.Fatalf("Parse = id %q type %q; encoding/json reads id %v type %v", p.ID, p.Type, fields["id"], fields["type"])
		}
		if p.Generated {
			open := bytes.IndexByte(body, '{') // only whitespace precedes it
			member := `"id":"` + generatedID + `"`
			// An accepted object has a type, so the id is always followed by a comma.
			rest, ok := bytes.CutPrefix(p.Body[open+1:], []byte(member+","))
			if !ok || !bytes.Equal(p.Body[:open+1], body[:open+1]) || !bytes.Equal(rest, body[open+1:]) {
				t.Fatalf("inserting the id changed other bytes: %q -> %q", body, p.Body)
			}
		} else if !bytes.Equal(p.Body, body) {
			t.Fatal("Body differs from a body that had an id")
		}
	})
}
