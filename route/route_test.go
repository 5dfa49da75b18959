package route

import (
	"strings"
	"testing"

	"github.com/slidinglog/ratelimit/internal/routememo"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/users/:id", "/users/{id}"},
		{"/users/{id}", "/users/{id}"},
		{"/users/{id:[0-9]+}", "/users/{id}"},
		{"/users/{id:[0-9]{1,3}}/x", "/users/{id}/x"},
		{"/files/*filepath", "/files/{...}"},
		{"/files/{path...}", "/files/{...}"},
		{"/files/{...}", "/files/{...}"},
		{"/static/*", "/static/{...}"},
		{"/a/:b/c/:d", "/a/{b}/c/{d}"},
		{"/", "/"},
		{"/{$}", "/{$}"},
		{"GET /users/{id}", "GET /users/{id}"},
		{"GET /users/:id", "GET /users/{id}"},
		{"/time:now", "/time:now"}, // a colon inside a segment is literal
		{"/v{version}/x", "/v{version}/x"},
		{"/v{version:[0-9]+}/x", "/v{version}/x"},
		{"/broken/{id", "/broken/{id"},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := normalize(tc.in); got != tc.want {
			t.Errorf("normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := Normalize(tc.want); got != tc.want {
			t.Errorf("Normalize is not idempotent on %q: %q", tc.want, got)
		}
	}
}

// TestNormalizeMemoBounded: client-chosen strings evict one another in
// the memo; they cannot grow it, and a long one is not kept.
func TestNormalizeMemoBounded(t *testing.T) {
	long := "/x/:" + strings.Repeat("a", 4096)
	for i := range 20_000 {
		p := "/users/:id" + strings.Repeat("z", i%300) + string(rune('a'+i%26)) + "/" + itoa(i)
		if got := Normalize(p); got != normalize(p) {
			t.Fatalf("Normalize(%q) = %q", p, got)
		}
		_ = Normalize(long)
	}
	if n := routememo.Len(); n > routememo.Cap {
		t.Errorf("%d entries, bound %d", n, routememo.Cap)
	}
	if n := Memoized(); n != routememo.Len() || n > MemoCap || MemoCap != routememo.Cap {
		t.Errorf("Memoized() = %d, with %d entries in the memo; MemoCap %d, the memo's %d", n, routememo.Len(), MemoCap, routememo.Cap)
	}
	if n := routememo.Bytes(); n > routememo.Cap*2*routememo.MaxLen {
		t.Errorf("%d bytes", n)
	}
}

func itoa(i int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []string{"/users/{id}", "/users/:id", "/users/{id:[0-9]+}", "/files/*", "/files/{p...}", "/{$}", "/", "/v{v}/x",
		"GET /users/{id}", "POST  /login", Unmatched} {
		if err := Validate(p); err != nil {
			t.Errorf("Validate(%q): %v", p, err)
		}
	}
	for _, p := range []string{"", "users", "/a/{", "/a/}", "/a/{}", "/a/{...}/b", "/a/*/b", "/a/x{...}", "/a?b", "/a#b", "/a b", "/a/{$}/b", "/a/{{x}}",
		"GETT /x", "get /x", "GET login", "GET "} {
		if err := Validate(p); err == nil {
			t.Errorf("Validate(%q) = nil", p)
		}
	}
}
