package admin_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/admin"
	"github.com/slidinglog/ratelimit/redistest"
)

// RequireBrowserEnv set to 1 makes TestBrowser fail, not skip, without
// Chromium: CI must not pass by skipping it.
const RequireBrowserEnv = "RATELIMIT_REQUIRE_BROWSER"

// ScreenshotEnv names a file TestBrowser saves its screenshot of the page
// to (a temporary directory if unset).
const ScreenshotEnv = "RATELIMIT_ADMIN_SCREENSHOT"

// chromium returns the path of a Chromium, skipping (or failing, under
// RequireBrowserEnv) the test without one.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(RequireBrowserEnv) == "1" {
		t.Fatalf("no chromium on PATH, and %s=1", RequireBrowserEnv)
	}
	t.Skipf("no chromium on PATH: the admin page is not checked in a browser (set %s=1 to fail instead; apt-get install chromium)", RequireBrowserEnv)
	return ""
}

// headless runs Chromium headless with args on url and returns its
// standard output. Its profile lives in the test's temporary directory.
func headless(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a cold start on a loaded machine, not a check
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, append(all, url)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// anchor is a link in the rendered table, with its text.
var anchor = regexp.MustCompile(`<a href="[^"]*">([^<]*)</a>`)

// domText is s as Chromium serializes a text node: &, < and > escaped.
func domText(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\u00a0", "&nbsp;").Replace(s)
}

// TestBrowser runs a load test against a Limiter on a real redis-server,
// with a few abusive clients (one with markup for a name) among many
// light ones and a spray of one-off identities, then loads the admin page
// in headless Chromium: the abusers are the top denied identifiers of the
// rendered DOM, their markup is text and not elements, and a screenshot
// is saved.
func TestBrowser(t *testing.T) {
	bin := chromium(t)
	srv := redistest.Start(t)
	adm := admin.New(admin.Options{Capacity: 50, Top: 10})
	start := time.Now()
	lim, err := ratelimit.New(srv.Client(), []ratelimit.Limit{
		ratelimit.Per(time.Minute, 5, ratelimit.Header("X-Client")).Named("per-client"),
		ratelimit.Per(time.Minute, 100000, ratelimit.Global()).Named("global"),
	}, ratelimit.WithObserver(adm.Observer()), ratelimit.WithTimeout(redistest.DecisionTimeout),
		ratelimit.WithClock(func() time.Time { return start })) // the load takes one instant, however slow the machine
	if err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer app.Close()

	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	abusers := []string{"abuser-" + fmt.Sprint(r.IntN(1000)), `<img src=x onerror=alert(1)>&friends`, "10.9.8.7"}
	type client struct {
		id string
		n  int
	}
	var load []client
	for i, id := range abusers {
		load = append(load, client{id, 80 + 40*(len(abusers)-i)}) // distinct counts: a known order
	}
	for i := range 60 {
		load = append(load, client{fmt.Sprintf("light-%d", i), 1 + r.IntN(5)}) // never denied
	}
	for i := range 150 {
		load = append(load, client{fmt.Sprintf("spray-%d-%d", seed%1000, i), 6 + r.IntN(3)}) // denied once to thrice
	}
	r.Shuffle(len(load), func(i, j int) { load[i], load[j] = load[j], load[i] })
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	denied := map[string]int{}
	for range 8 {
		wg.Go(func() {
			for id := range work {
				req, _ := http.NewRequest("GET", app.URL+"/", nil)
				req.Header.Set("X-Client", id)
				resp, err := app.Client().Do(req)
				if err != nil {
					t.Error(err)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					mu.Lock()
					denied[id]++
					mu.Unlock()
				}
			}
		})
	}
	for _, c := range load {
		for range c.n {
			work <- c.id
		}
	}
	close(work)
	wg.Wait()
	for i, id := range abusers {
		if want := 80 + 40*(len(abusers)-i) - 5; denied[id] != want {
			t.Fatalf("seed %d: %q denied %d times, want %d", seed, id, denied[id], want)
		}
	}

	// An override and a block, shown with their Clear and Unblock forms.
	op := lim.Inspect().Operator()
	if err := op.SetQuota(context.Background(), "per-client", "", 7, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := op.Block(context.Background(), abusers[0], time.Hour); err != nil {
		t.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/debug/ratelimit/", adm)
	adminSrv := httptest.NewServer(mux)
	defer adminSrv.Close()
	url := adminSrv.URL + "/debug/ratelimit/"

	dom := headless(t, bin, url, "--dump-dom")
	if !strings.Contains(dom, "Limit per-client") {
		t.Fatalf("seed %d: the rendered page has no per-client section:\n%s", seed, dom)
	}
	if strings.Contains(dom, "<img") || strings.Contains(dom, "<script") {
		t.Errorf("seed %d: an identifier became markup in the DOM:\n%s", seed, dom)
	}
	// The abusers, most denied first, at the head of the per-client table.
	table := dom[strings.Index(dom, `data-limit="per-client"`):]
	table = table[:strings.Index(table, "</table>")]
	var listed []string
	for _, m := range anchor.FindAllStringSubmatch(table, -1) {
		listed = append(listed, m[1])
	}
	if len(listed) != 10 {
		t.Errorf("seed %d: %d identifiers listed, want 10 (Options.Top)", seed, len(listed))
	}
	for i, id := range abusers {
		if i >= len(listed) || listed[i] != domText(id) {
			t.Fatalf("seed %d: the rendered table lists %q first, want the abusers %q in order:\n%s", seed, listed, abusers, table)
		}
	}

	blocks := dom[strings.Index(dom, `class="blocks"`):]
	blocks = blocks[:strings.Index(blocks, "</table>")]
	if !strings.Contains(blocks, abusers[0]) || !strings.Contains(blocks, "Unblock") {
		t.Errorf("seed %d: the blocks table does not show %q with its Unblock form:\n%s", seed, abusers[0], blocks)
	}
	overrides := dom[strings.Index(dom, `class="overrides"`):]
	overrides = overrides[:strings.Index(overrides, "</table>")]
	if !strings.Contains(overrides, "per-client") || !strings.Contains(overrides, ">7<") || !strings.Contains(overrides, "Clear") {
		t.Errorf("seed %d: the overrides table does not show per-client's 7:\n%s", seed, overrides)
	}

	shot := os.Getenv(ScreenshotEnv)
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "admin.png")
	}
	headless(t, bin, url, "--screenshot="+shot, "--window-size=1100,900", "--hide-scrollbars")
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot of the admin page: %s (seed %d)", shot, seed)
}
