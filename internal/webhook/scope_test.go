package webhook

import (
	"net/http"
	"testing"
)

type captureTransport struct{ got *http.Request }

func (c *captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.got = req
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

// TestNameSelectingTransport: list and watch requests on the scoped
// collections carry the name's field selector (added to any other); other
// paths, gets by name and writes pass unchanged, and the caller's request
// is not modified.
func TestNameSelectingTransport(t *testing.T) {
	names := map[string]string{"/api/v1/namespaces/ns/secrets": "cert"}
	for _, c := range []struct {
		method, url, wantQuery string
	}{
		{http.MethodGet, "https://h/api/v1/namespaces/ns/secrets?limit=500", "fieldSelector=metadata.name%3Dcert&limit=500"},
		{http.MethodGet, "https://h/api/v1/namespaces/ns/secrets?watch=true&fieldSelector=type%3Dx", "fieldSelector=type%3Dx%2Cmetadata.name%3Dcert&watch=true"},
		{http.MethodGet, "https://h/api/v1/namespaces/ns/secrets/cert", ""},
		{http.MethodGet, "https://h/api/v1/namespaces/other/secrets?limit=500", "limit=500"},
		{http.MethodPost, "https://h/api/v1/namespaces/ns/secrets", ""},
	} {
		next := &captureTransport{}
		req, err := http.NewRequest(c.method, c.url, http.NoBody)
		if err != nil {
			t.Fatal(err)
		}
		before := req.URL.String()
		resp, err := (&nameSelectingTransport{next: next, names: names}).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if got := next.got.URL.RawQuery; got != c.wantQuery {
			t.Errorf("%s %s: query %q, want %q", c.method, c.url, got, c.wantQuery)
		}
		if req.URL.String() != before {
			t.Errorf("%s %s: the caller's request was modified", c.method, c.url)
		}
	}
}
