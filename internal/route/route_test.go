package route

import "testing"

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/users/:id", "/users/{id}"},
		{"/users/{id}", "/users/{id}"},
		{"/files/*filepath", "/files/{filepath...}"},
		{"/static/*", "/static/{...}"},
		{"/a/:b/c/:d", "/a/{b}/c/{d}"},
		{"/", "/"},
		{"GET /users/{id}", "GET /users/{id}"},
		{"/time:now", "/time:now"}, // a colon inside a segment is literal
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := Cached(tc.in); got != tc.want {
			t.Errorf("Cached(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
