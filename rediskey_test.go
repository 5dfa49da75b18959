package ratelimit

import (
	"net/http/httptest"
	"strings"
	"testing"
)

const testHead = defaultPrefix + "ip:{"

func TestRedisKey(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"203.0.113.7", "ratelimit:ip:{203.0.113.7}"},
		{"GET /users/{id}", "ratelimit:ip:{GET%20/users/%7Bid%7D}"},
		{"a%7Bb", "ratelimit:ip:{a%257Bb}"}, // '%' is escaped, so this differs from "a{b"
		{"a{b", "ratelimit:ip:{a%7Bb}"},
		{"x\x00y\n", "ratelimit:ip:{x%00y%0A}"},
		{"#hash|pipe", "ratelimit:ip:{%23hash%7Cpipe}"},
		{"é", "ratelimit:ip:{%C3%A9}"},
	} {
		if got := string(appendKey(nil, testHead, tc.id, false)); got != tc.want {
			t.Errorf("key(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
	long := strings.Repeat("{", 64<<10)
	got := string(appendKey(nil, testHead, long, false))
	if len(got) > len(testHead)+1+43+1 || !strings.HasPrefix(got, testHead+"#") {
		t.Errorf("64 KB identifier gave a %d-byte key %q", len(got), got)
	}
	if got == string(appendKey(nil, testHead, long+"x", false)) {
		t.Error("two long identifiers share a key")
	}
}

// checkKey asserts what every Redis key must satisfy: bounded length and
// exactly one hash tag, the one around the identifier.
func checkKey(t *testing.T, id, key string) {
	t.Helper()
	if len(key) > len(testHead)+maxIDLen+1 {
		t.Fatalf("key for %q is %d bytes", id, len(key))
	}
	if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || !strings.HasSuffix(key, "}") {
		t.Fatalf("key %q for %q has a hash tag of the client's", key, id)
	}
}

// FuzzRedisKey: distinct identifiers never share a key, and no identifier can
// add a hash tag or make a long key.
func FuzzRedisKey(f *testing.F) {
	for _, seed := range [][2]string{
		{"a", "b"}, {"a{b}", "a%7Bb%7D"}, {"{x}", "x"}, {"a|b", "a%7Cb"},
		{strings.Repeat("z", 128), strings.Repeat("z", 129)}, {"#", "%23"}, {"\x00", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ka, kb := string(appendKey(nil, testHead, a, false)), string(appendKey(nil, testHead, b, false))
		checkKey(t, a, ka)
		checkKey(t, b, kb)
		if (a == b) != (ka == kb) {
			t.Fatalf("ids %q and %q: keys %q and %q", a, b, ka, kb)
		}
	})
}

// FuzzComposeKey: Compose keeps its parts apart, so ("a|b", "c") and
// ("a", "b|c") are different clients.
func FuzzComposeKey(f *testing.F) {
	f.Add("a|b", "c", "a", "b|c")
	f.Add("a", "%7Cb", "a%7C", "b")
	f.Add("x", "y", "x", "y")
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2 string) {
		if a1 == "" || a2 == "" || b1 == "" || b2 == "" {
			return
		}
		k := Compose(Header("A"), Header("B"))
		id := func(x, y string) string {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header["A"], r.Header["B"] = []string{x}, []string{y}
			v, err := k.fn(r)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		ia, ib := id(a1, a2), id(b1, b2)
		if (a1 == b1 && a2 == b2) != (ia == ib) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", a1, a2, ia, b1, b2, ib)
		}
		checkKey(t, ia, string(appendKey(nil, testHead, ia, true)))
	})
}
