package api_test

import (
	"fmt"
	"net/http"
	"testing"
)

func TestSubscriberListPagination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.createSubscriber(t, fmt.Sprintf(`{"id":"s%d","url":"http://127.0.0.1:9/"}`, i))
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination did not end")
		}
		var page struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
			NextCursor *string `json:"next_cursor"`
		}
		b.do(t, http.MethodGet, "/v1/subscribers?limit=2&cursor="+cursor, "", http.StatusOK, &page)
		for _, s := range page.Data {
			seen = append(seen, s.ID)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if fmt.Sprint(seen) != "[s0 s1 s2 s3 s4]" {
		t.Fatalf("pages walked %v, want every subscriber once in id order", seen)
	}
}
