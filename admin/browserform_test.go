package admin_test

import (
	"context"
	"html"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/slidinglog/ratelimit/admin"
	"github.com/slidinglog/ratelimit/operator"
)

// row is one row of the page's table of top denied identifiers: its link
// to the state page, then its Reset form.
var row = regexp.MustCompile(`(?s)<a href="id\?([^"]*)">.*?(<form class="inline" method="post" action="reset">.*?</form>)`)

// TestBrowserResetForm generates identifiers holding lone CRs and LFs,
// CRLFs and their mixes, each denied along with its twins (the same with
// every line break spelt otherwise), and has headless Chromium submit
// the page's own Reset forms of some of them, from the page's origin:
// exactly those identifiers are reset, never a twin. Form encoding turns
// a lone CR or LF into CRLF; the forms must carry identifiers in a form
// it leaves alone.
func TestBrowserResetForm(t *testing.T) {
	bin := chromium(t)
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	f := newFixture(t, admin.Options{Capacity: 64, Top: 64})
	ctx := context.Background()
	breaks := []string{"\r", "\n", "\r\n", "\n\r"}
	var ids []string
	seen := map[string]bool{}
	for range 3 + r.IntN(4) {
		parts := []string{"a", "b"}
		for range 1 + r.IntN(3) {
			parts = append(parts, hostileID(r))
		}
		var twins []string
		for range 3 {
			var b strings.Builder
			for i, p := range parts {
				if i > 0 {
					b.WriteString(breaks[r.IntN(len(breaks))])
				}
				b.WriteString(p)
			}
			if id := b.String(); !seen[id] {
				seen[id] = true
				twins = append(twins, id)
			}
		}
		ids = append(ids, twins...)
	}
	for _, id := range ids {
		for range 4 {
			_, _ = f.lim.Allow(ctx, []string{id, "global"}, 1)
		}
	}
	_, page := f.get(t, "", nil)
	forms := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(page, -1) {
		q, err := url.ParseQuery(html.UnescapeString(m[1]))
		if err != nil || q.Get("limit") != "client" {
			continue
		}
		forms[q.Get("id")+q.Get("digest")] = m[2] // a long one is listed by its digest
	}
	submitted := map[string]bool{}
	var frames strings.Builder
	for _, id := range ids {
		form, ok := forms[id]
		if d := operator.IDDigest(id); d != "" {
			form, ok = forms[d]
		}
		if !ok {
			t.Fatalf("seed %d: the page has no row for %q", seed, id)
		}
		if r.IntN(2) == 0 {
			continue
		}
		submitted[id] = true
		form = strings.Replace(form, `action="reset"`, `action="/debug/ratelimit/reset"`, 1)
		frames.WriteString(`<iframe srcdoc="` + html.EscapeString(form+`<script>document.forms[0].submit()</script>`) + `"></iframe>`)
	}
	// The frames' page, from the admin's origin, as the page itself would
	// be: the forms are the page's, verbatim.
	mux := http.NewServeMux()
	mux.Handle("/debug/ratelimit/", f.adm)
	mux.HandleFunc("/frames", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte("<!DOCTYPE html><html><body>" + frames.String() + "</body></html>"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	headless(t, bin, srv.URL+"/frames", "--dump-dom", "--virtual-time-budget=10000")
	for _, id := range ids {
		lr, err := f.lim.Inspect().Status(ctx, "client", id)
		if err != nil {
			t.Fatal(err)
		}
		if reset := lr.Remaining == 3; reset != submitted[id] {
			t.Errorf("seed %d: %q: reset %v, its form submitted %v", seed, id, reset, submitted[id])
		}
	}
}
