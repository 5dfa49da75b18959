package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/admin"
	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// hostileID returns a random identifier a client could send: markup,
// quotes, URL and JSON metacharacters, control bytes and invalid UTF-8
// among letters.
func hostileID(r *rand.Rand) string {
	parts := []string{"<script>alert(1)</script>", `"><img src=x onerror=alert(1)>`, "'", "&amp;", "%2F", "?id=x&limit=y",
		"\\u003c", "\x00", "\x1b[31m", "é", "{", "}", ":", " ", "a", "b", "7"}
	var b strings.Builder
	for range 1 + r.IntN(6) {
		b.WriteString(parts[r.IntN(len(parts))])
	}
	return b.String()
}

type fixture struct {
	adm  *admin.Handler
	lim  *ratelimit.Limiter
	srv  *httptest.Server
	base string
}

// newFixture: a Limiter of two limits on miniredis, observed by an admin
// Handler mounted at /debug/ratelimit/.
func newFixture(t *testing.T, opts admin.Options) *fixture {
	mr := miniredis.RunT(t)
	mr.SetTime(t0)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	if opts.Now == nil {
		opts.Now = func() time.Time { return t0 }
	}
	adm := admin.New(opts)
	lim, err := ratelimit.New(nil, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 3, ratelimit.Header("X-Client")).Named("client"),
		ratelimit.Per(time.Minute, 1000, ratelimit.Global()).Named("all"),
	}, ratelimit.WithObserver(adm.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout), ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: -1})))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/debug/ratelimit/", adm)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &fixture{adm: adm, lim: lim, srv: srv, base: srv.URL + "/debug/ratelimit/"}
}

func (f *fixture) get(t *testing.T, path string, v any) (int, string) {
	t.Helper()
	resp, err := http.Get(f.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("%s: %v in %s", path, err, body)
		}
	}
	return resp.StatusCode, string(body)
}

// TestTopDenied generates denials of random hostile identifiers with
// random weights, and checks the JSON lists exactly the most denied
// (the sketch is large enough to count every one exactly), that the HTML
// page never carries an identifier's markup unescaped, and that each
// identifier's state and reset work from the link the page gives.
func TestTopDenied(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	f := newFixture(t, admin.Options{Capacity: 64, Top: 5})
	ctx := context.Background()
	want := map[string]uint64{}
	drawn := map[string]bool{} // an identifier drawn twice has its first count in its log
	for range 1 + r.IntN(20) {
		id := hostileID(r)
		if drawn[id] {
			continue
		}
		drawn[id] = true
		n := r.IntN(12)
		for range 3 + n {
			res, err := f.lim.Allow(ctx, []string{id, "global"}, 1)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if !res.Allowed {
				want[id]++
			}
		}
		if uint64(n) != want[id] {
			t.Fatalf("seed %d: %q denied %d times, want %d", seed, id, want[id], n)
		}
		if n == 0 {
			delete(want, id)
		}
	}
	var idx admin.Index
	if code, body := f.get(t, "?format=json", &idx); code != http.StatusOK {
		t.Fatalf("seed %d: %d %s", seed, code, body)
	}
	if len(idx.Limits) != 2 || idx.Limits[0].Name != "all" || idx.Limits[1].Name != "client" {
		t.Fatalf("seed %d: limits %+v", seed, idx.Limits)
	}
	if idx.WindowSeconds != 600 || len(idx.Overrides) != 0 || len(idx.Blocks) != 0 {
		t.Errorf("seed %d: %+v", seed, idx)
	}
	top := idx.Limits[1].Top
	var total uint64
	for _, n := range want {
		total += n
	}
	if idx.Limits[1].Denied != total {
		t.Errorf("seed %d: %d denials, want %d", seed, idx.Limits[1].Denied, total)
	}
	if len(top) != min(5, len(want)) {
		t.Fatalf("seed %d: %d listed, want %d", seed, len(top), min(5, len(want)))
	}
	for _, e := range top {
		if e.Count != want[e.ID] || e.Err != 0 {
			t.Errorf("seed %d: %q listed with %d±%d, denied %d times", seed, e.ID, e.Count, e.Err, want[e.ID])
		}
	}
	// Nobody left out was denied more than the last listed.
	listed := map[string]bool{}
	for _, e := range top {
		listed[e.ID] = true
	}
	for id, n := range want {
		if !listed[id] && len(top) > 0 && n > top[len(top)-1].Count {
			t.Errorf("seed %d: %q denied %d times, not listed above %d", seed, id, n, top[len(top)-1].Count)
		}
	}

	// The HTML page: markup in identifiers is escaped.
	code, page := f.get(t, "", nil)
	if code != http.StatusOK {
		t.Fatalf("seed %d: page %d", seed, code)
	}
	if strings.Contains(page, "<script>") || strings.Contains(page, "<img") || strings.Contains(page, "\x00") {
		t.Errorf("seed %d: an identifier's markup reached the page unescaped:\n%s", seed, page)
	}

	// Each listed identifier: its state, then a reset.
	for _, e := range top {
		q := url.Values{"limit": {"client"}, "id": {e.ID}}.Encode()
		var st admin.IDState
		if code, body := f.get(t, "id?format=json&"+q, &st); code != http.StatusOK {
			t.Fatalf("seed %d: state of %q: %d %s", seed, e.ID, code, body)
		}
		if st.ID != e.ID || st.Limit != "client" || st.Quota != 3 || st.Remaining != 0 || !st.Denied || st.DeniedRecently != e.Count {
			t.Errorf("seed %d: state of %q: %+v", seed, e.ID, st)
		}
		if code, page := f.get(t, "id?"+q, nil); code != http.StatusOK || strings.Contains(page, "<script>") || strings.Contains(page, "<img") {
			t.Errorf("seed %d: state page of %q: %d\n%s", seed, e.ID, code, page)
		}
		resp, err := http.PostForm(f.base+"reset", url.Values{"limit": {"client"}, "id": {e.ID}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/debug/ratelimit/id" {
			t.Errorf("seed %d: reset of %q: %d at %s", seed, e.ID, resp.StatusCode, resp.Request.URL)
		}
		if lr, err := f.lim.Inspect().Status(ctx, "client", e.ID); err != nil || lr.Remaining != 3 {
			t.Errorf("seed %d: after the reset of %q: %+v %v", seed, e.ID, lr, err)
		}
	}
}

// TestOperatorState: the index and an identifier's state show the
// overrides and blocks in force, and the page's Unblock and Clear forms
// lift them.
func TestOperatorState(t *testing.T) {
	f := newFixture(t, admin.Options{})
	ctx := context.Background()
	op := f.lim.Inspect().Operator() // applied by f.lim at once
	if err := op.SetQuota(ctx, "client", "", 9, 0); err != nil {
		t.Fatal(err)
	}
	if err := op.Block(ctx, `<b>mallory</b>`, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := op.Block(ctx, "10.0.0.0/8", time.Hour); err != nil {
		t.Fatal(err)
	}
	var idx admin.Index
	if code, body := f.get(t, "?format=json", &idx); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if len(idx.Overrides) != 1 || idx.Overrides[0].Limit != "client" || idx.Overrides[0].Quota != 9 || idx.Overrides[0].Expires != nil {
		t.Errorf("overrides: %+v", idx.Overrides)
	} else if d := idx.Overrides[0].Declared; len(d) != 1 || d[0] != 3 {
		t.Errorf("the override of client is shown beside the declared quotas %v, want [3]", d)
	}
	if len(idx.Blocks) != 2 || idx.Blocks[0].Target != "10.0.0.0/8" || idx.Blocks[1].Target != `<b>mallory</b>` {
		t.Errorf("blocks: %+v", idx.Blocks)
	}
	var st admin.IDState
	q := url.Values{"limit": {"client"}, "id": {"10.1.2.3"}}.Encode()
	if code, body := f.get(t, "id?format=json&"+q, &st); code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if st.Quota != 9 || st.Override == nil || st.Override.Quota != 9 || len(st.Override.Declared) != 1 || st.Block == nil || st.Block.Target != "10.0.0.0/8" || !st.Denied {
		t.Errorf("state of an address in a blocked network: %+v", st)
	}
	code, page := f.get(t, "", nil)
	if code != http.StatusOK || strings.Contains(page, "<b>mallory") || !strings.Contains(page, `<td class="n declared">3</td>`) || !strings.Contains(page, `action="unblock"`) || !strings.Contains(page, `action="clear"`) {
		t.Errorf("the page: %d\n%s", code, page)
	}
	for _, form := range []struct {
		path string
		v    url.Values
	}{
		{"unblock", url.Values{"target": {`<b>mallory</b>`}}},
		{"unblock", url.Values{"target": {"10.0.0.0/8"}}},
		{"clear", url.Values{"limit": {"client"}, "plan": {""}}},
	} {
		resp, err := http.PostForm(f.base+form.path, form.v)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/debug/ratelimit/" {
			t.Errorf("POST %s %v: %d at %s", form.path, form.v, resp.StatusCode, resp.Request.URL)
		}
	}
	idx = admin.Index{}
	f.get(t, "?format=json", &idx)
	if len(idx.Overrides) != 0 || len(idx.Blocks) != 0 {
		t.Errorf("after the forms: %+v %+v", idx.Overrides, idx.Blocks)
	}
	if res, err := f.lim.Allow(ctx, []string{`<b>mallory</b>`, "global"}, 1); err != nil || !res.Allowed || res.Limit != 3 {
		t.Errorf("mallory after the unblock: %+v %v", res, err)
	}
}

// TestRefusals: what the Handler refuses, and with which status.
func TestRefusals(t *testing.T) {
	f := newFixture(t, admin.Options{})
	post := func(header http.Header, form url.Values) int {
		req, _ := http.NewRequest("POST", f.base+"reset?format=json", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ok := url.Values{"limit": {"client"}, "id": {"x"}}
	for _, c := range []struct {
		name string
		got  int
		want int
	}{
		{"a cross-site POST", post(http.Header{"Sec-Fetch-Site": {"cross-site"}}, ok), http.StatusForbidden},
		{"a POST from another origin", post(http.Header{"Origin": {"https://evil.example"}}, ok), http.StatusForbidden},
		{"a POST from a tool", post(nil, ok), http.StatusOK},
		{"an unknown limit", post(nil, url.Values{"limit": {"nope"}, "id": {"x"}}), http.StatusNotFound},
		{"no id", post(nil, url.Values{"limit": {"client"}}), http.StatusBadRequest},
		{"an id too long", post(nil, url.Values{"limit": {"client"}, "id": {strings.Repeat("x", admin.MaxID+1)}}), http.StatusBadRequest},
		{"an id64 not base64url", post(nil, url.Values{"limit": {"client"}, "id64": {"a=b"}}), http.StatusBadRequest},
		{"a digest not a digest", post(nil, url.Values{"limit": {"client"}, "digest": {"#" + strings.Repeat("a", 42)}}), http.StatusBadRequest},
		{"both id and digest", post(nil, url.Values{"limit": {"client"}, "id": {"x"}, "digest": {operator.IDDigest(strings.Repeat("x", 200))}}), http.StatusBadRequest},
		{"a digest", post(nil, url.Values{"limit": {"client"}, "digest": {operator.IDDigest(strings.Repeat("x", 200))}}), http.StatusOK},
		{"a reset by GET", func() int { c, _ := f.get(t, "reset?limit=client&id=x", nil); return c }(), http.StatusMethodNotAllowed},
		{"an unknown page", func() int { c, _ := f.get(t, "nope", nil); return c }(), http.StatusNotFound},
		{"n=0", func() int { c, _ := f.get(t, "?n=0", nil); return c }(), http.StatusBadRequest},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
	var e map[string]string
	resp, _ := http.Get(f.base + "id?format=json&limit=nope&id=x")
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || e["error"] == "" {
		t.Errorf("JSON error: %d %v", resp.StatusCode, e)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("JSON error content type %q", ct)
	}
}

// TestObserveDenialNoAlloc: the denial path allocates nothing for an
// identifier already counted, and little for a new one.
func TestObserveDenialNoAlloc(t *testing.T) {
	adm := admin.New(admin.Options{Now: func() time.Time { return t0 }})
	deny := adm.Observer().Denial
	deny("api", "203.0.113.9")
	if a := testing.AllocsPerRun(1000, func() { deny("api", "203.0.113.9") }); a != 0 {
		t.Errorf("%v allocations per denial of a known identifier", a)
	}
	if a := testing.AllocsPerRun(1000, func() { deny("api", fmt.Sprint("x")) }); a > 2 {
		t.Errorf("%v allocations per denial", a)
	}
}

// BenchmarkObserveDenial: the cost the Handler adds to a denial, for a
// client denied again (known) and for a spray of new identities.
func BenchmarkObserveDenial(b *testing.B) {
	adm := admin.New(admin.Options{})
	deny := adm.Observer().Denial
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("198.51.%d.%d", i/256, i%256)
	}
	b.Run("known", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			deny("api", "203.0.113.9")
		}
	})
	b.Run("spray", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			deny("api", ids[i%len(ids)])
			i++
		}
	})
}

// TestBurstState: an identifier's state in a token bucket (ratelimit.Burst)
// shows its burst as the quota, the burst's refill as the window, what is
// available now, and a reset empties the bucket.
func TestBurstState(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(t0)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	adm := admin.New(admin.Options{Now: func() time.Time { return t0 }})
	lim, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Burst(time.Second, 10, 5, ratelimit.Header("X-Client")).Named("bucket")},
		ratelimit.WithObserver(adm.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout), ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: -1})))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/debug/ratelimit/", adm)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f := &fixture{adm: adm, lim: lim, srv: srv, base: srv.URL + "/debug/ratelimit/"}
	ctx := context.Background()
	for range 7 {
		if _, err := lim.Allow(ctx, []string{"c1"}, 1); err != nil {
			t.Fatal(err)
		}
	}
	q := url.Values{"limit": {"bucket"}, "id": {"c1"}}.Encode()
	var st admin.IDState
	if code, body := f.get(t, "id?format=json&"+q, &st); code != http.StatusOK {
		t.Fatalf("state: %d %s", code, body)
	}
	if st.Quota != 5 || st.WindowSeconds != 0.5 || st.Remaining != 0 || !st.Denied || st.DeniedRecently != 2 {
		t.Errorf("state of a full bucket: %+v; want quota 5 per 0.5s, none remaining, denied twice", st)
	}
	if code, page := f.get(t, "id?"+q, nil); code != http.StatusOK || !strings.Contains(page, "bucket") {
		t.Errorf("state page: %d\n%s", code, page)
	}
	resp, err := http.PostForm(f.base+"reset", url.Values{"limit": {"bucket"}, "id": {"c1"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if lr, err := lim.Inspect().Status(ctx, "bucket", "c1"); err != nil || lr.Remaining != 5 {
		t.Errorf("after a reset: %+v %v; want the whole burst", lr, err)
	}
}
