package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/clientip"
)

// readmeSnippets holds the README's shorter code blocks line for line, so
// that the compiler checks them; TestReadmeSnippets checks that the README
// still says the same. It is never called.
func readmeSnippets(limiter *ratelimit.Limiter, mux *http.ServeMux, r chi.Router, e *echo.Echo, g *gin.Engine, cloudflareRanges []string) {
	// Limits: route limits.
	ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
		"POST /login":  {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 5, ratelimit.ClientIP()).Named("login")}},
		"GET /reports": {Cost: 10},
	})

	// Routers.
	http.ListenAndServe(":8080", limiter.Handler(mux)) // net/http: wrap the whole mux
	r.Use(chiratelimit.Middleware(limiter))            // chi, on the root router
	e.Use(echoratelimit.Middleware(limiter))           // echo; denials reach your HTTPErrorHandler
	g.Use(ginratelimit.Middleware(limiter))            // gin, before adding routes

	// Keys and proxies.
	// AWS ALB, or any load balancer in your network: trust its subnets
	ratelimit.ClientIP(clientip.TrustProxies("10.0.0.0/16"))
	// nginx on the host with `proxy_set_header X-Real-IP $remote_addr;`
	ratelimit.ClientIP(clientip.TrustProxies("127.0.0.1", "::1"), clientip.ProxyHeader("X-Real-IP"))
	// Cloudflare: its ranges from https://www.cloudflare.com/ips/, kept current by you
	ratelimit.ClientIP(clientip.TrustCloudflare(cloudflareRanges...))
	// the proxies configured once, in the router (gin, echo, or middleware that sets RemoteAddr)
	ratelimit.ClientIP(clientip.FromRouter())
}

// unguarded are the README's Go blocks that no compiled code holds, by
// their first line, with the reason.
var unguarded = map[string]string{
	"srv := grpc.NewServer( // gRPC: one interceptor for calls, one for streams": "the examples module does not require grpc; adapters/grpc's tests mount it so",
}

// TestReadmeSnippets: every Go block of the README is compiled code: the
// quick start is main.go (TestReadmeQuickStart), the others are lines of
// readmeSnippets, but for the few in unguarded.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(self), "func readmeSnippets(")
	body, _, _ = strings.Cut(body, "\n}\n")
	snippets := "\n" + trimLines(body) + "\n"
	blocks := goBlocks(string(readme))
	if len(blocks) < 2 {
		t.Fatalf("README.md: %d Go blocks; want the quick start and more", len(blocks))
	}
	for _, b := range blocks {
		first, _, _ := strings.Cut(b, "\n")
		switch {
		case strings.Contains(string(program), strings.TrimSpace(b)): // the quick start's excerpt (TestReadmeQuickStart)
		case unguarded[first] != "":
		case !strings.Contains(snippets, "\n"+trimLines(b)+"\n"):
			t.Errorf("README.md's block starting %q is not in readmeSnippets (readme_test.go): copy it there so that it compiles", first)
		}
	}
}

// goBlocks returns the ```go blocks of markdown.
func goBlocks(markdown string) []string {
	var blocks []string
	for {
		var ok bool
		_, markdown, ok = strings.Cut(markdown, "```go\n")
		if !ok {
			return blocks
		}
		var b string
		b, markdown, _ = strings.Cut(markdown, "\n```\n")
		blocks = append(blocks, b)
	}
}

// trimLines trims the blank space around each line of s.
func trimLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, "\n")
}

// TestReadmeLinksEveryDoc: the README is the way in to every page of docs/.
func TestReadmeLinksEveryDoc(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("docs/*.md: %v %v", pages, err)
	}
	for _, p := range pages {
		if link := "](docs/" + filepath.Base(p) + ")"; !strings.Contains(string(readme), link) {
			t.Errorf("README.md does not link %s (no %q)", p[len("../../"):], link)
		}
	}
}
