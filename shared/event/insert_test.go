package event

import "testing"

// Parse never reaches an empty object (type is required), so insertID's
// no-comma branch is checked directly.
func TestInsertID(t *testing.T) {
	t.Parallel()
	tests := []struct{ body, want string }{
		{`{}`, `{"id":"evt_1"}`},
		{` { } `, ` {"id":"evt_1" } `},
		{`{"a":1}`, `{"id":"evt_1","a":1}`},
		{"\n{\n\"a\":1}", "\n{\"id\":\"evt_1\",\n\"a\":1}"},
	}
	for _, tc := range tests {
		open := skipSpace([]byte(tc.body), 0)
		if got := string(insertID([]byte(tc.body), open, "evt_1")); got != tc.want {
			t.Errorf("insertID(%q) = %q, want %q", tc.body, got, tc.want)
		}
	}
}
