package ratelimit

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

var testHead = keyHead(defaultPrefix, "ip", "ip", false)

func TestRedisKey(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"203.0.113.7", "ratelimit:ip:ip:{203.0.113.7}"},
		{"GET /users/{id}", "ratelimit:ip:ip:{GET%20/users/%7Bid%7D}"},
		{"a%7Bb", "ratelimit:ip:ip:{a%257Bb}"}, // '%' is escaped, so this differs from "a{b"
		{"a{b", "ratelimit:ip:ip:{a%7Bb}"},
		{"x\x00y\n", "ratelimit:ip:ip:{x%00y%0A}"},
		{"#hash|pipe", "ratelimit:ip:ip:{%23hash%7Cpipe}"},
		{"é", "ratelimit:ip:ip:{%C3%A9}"},
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

// FuzzKeyHead: the heads of two limits differ whenever their names, their
// kinds of key or their exactness do (bucketed heads have no name), so
// two limits of one name whose keys count different things never share a
// log; a head holds no hash tag of its own and ends where the identifier's
// starts; and no head is one of the layout without the kind
// (<prefix><name>:{ and <prefix>{), whose logs a deploy leaves behind.
func FuzzKeyHead(f *testing.F) {
	f.Add("login", "ip", false, "login", "header.X-Api-Key", false)
	f.Add("a", "b:c", false, "a:b", "c", false)
	f.Add("a", "ip", true, "x", "ip", false)
	f.Add("n", "ip+route", false, "n", "ip%2Broute", false)
	f.Add("ip", "x", false, "", "ip", true)
	f.Fuzz(func(t *testing.T, n1, k1 string, b1 bool, n2, k2 string, b2 bool) {
		if !validName(n1) || !validName(n2) || k1 == "" || k2 == "" {
			return // New names every limit validly; every Key has a kind
		}
		for _, prefix := range []string{defaultPrefix, defaultPrefix + "{" + singleSlotTag + "}"} {
			h1, h2 := keyHead(prefix, n1, k1, b1), keyHead(prefix, n2, k2, b2)
			same := k1 == k2 && b1 == b2 && (b1 || n1 == n2)
			if (h1 == h2) != same {
				t.Fatalf("(%q, %q, bucketed %v) and (%q, %q, bucketed %v): heads %q and %q", n1, k1, b1, n2, k2, b2, h1, h2)
			}
			for _, h := range []string{h1, h2} {
				body := strings.TrimPrefix(h, prefix)
				if strings.ContainsAny(body[:len(body)-1], "{}") || !strings.HasSuffix(body, ":{") {
					t.Fatalf("head %q has a hash tag of its own", h)
				}
				old := strings.TrimSuffix(body, ":{")
				if body == "{" || validName(old) {
					t.Fatalf("head %q is a head of the layout without the kind", h)
				}
			}
		}
	})
}

// TestGlobalKey: the key a limit keeps for the Global identifier is the
// one appendKey builds, escaped or not, for each kind of head.
func TestGlobalKey(t *testing.T) {
	cfg := defaultConfig()
	for _, lim := range []Limit{
		Per(time.Minute, 10, Global()).Named("g"),
		Per(time.Minute, 10, ClientIP()).Named("ip"),
		Per(time.Minute, 10, Global()).Named("b").Bucketed(time.Second),
	} {
		c := compileLimit(&cfg, lim)
		for _, escaped := range []bool{false, true} {
			if want := string(appendKey(nil, c.head, globalID, escaped)); c.globalKey != want {
				t.Errorf("%s: globalKey %q, appendKey (escaped %v) %q", lim.Name, c.globalKey, escaped, want)
			}
		}
	}
}
