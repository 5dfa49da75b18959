package adapters_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// TestRouterClientIP: ClientIP(clientip.FromRouter()) counts by
// the client address the router resolved, with the proxies configured
// once, in the router: gin's SetTrustedProxies, echo's IPExtractor, chi's
// RealIP. Three clients behind one load balancer (10.0.0.1) get one bucket
// each, a client that forges X-Forwarded-For from outside the trusted
// proxies gets its own address's, and the handler still sees the peer in
// RemoteAddr. echo without an IPExtractor counts by the peer.
func TestRouterClientIP(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		newLimiter := func(t *testing.T) *ratelimit.Limiter {
			o := append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout), ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{Prefix: t.Name() + ":"}))}, opts...)
			l, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.FromRouter())).Named("ip")}, o...)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		var seen string // RemoteAddr as the handler saw it
		handler := func(w http.ResponseWriter, r *http.Request) { seen = r.RemoteAddr; _, _ = w.Write([]byte("ok")) }
		routers := map[string]func(l *ratelimit.Limiter) http.Handler{
			"gin": func(l *ratelimit.Limiter) http.Handler {
				gin.SetMode(gin.ReleaseMode)
				e := gin.New()
				if err := e.SetTrustedProxies([]string{"10.0.0.0/8"}); err != nil {
					t.Fatal(err)
				}
				e.Use(ginratelimit.Middleware(l))
				e.GET("/x", func(c *gin.Context) { handler(c.Writer, c.Request) })
				return e
			},
			"echo": func(l *ratelimit.Limiter) http.Handler {
				e := echo.New()
				e.IPExtractor = echo.ExtractIPFromXFFHeader(echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false), echo.TrustIPRange(mustCIDR(t, "10.0.0.0/8")))
				e.Use(echoratelimit.Middleware(l))
				e.GET("/x", func(c echo.Context) error { handler(c.Response(), c.Request()); return nil })
				return e
			},
			"chi": func(l *ratelimit.Limiter) http.Handler {
				r := chi.NewRouter()
				r.Use(middleware.RealIP, chiratelimit.Middleware(l))
				r.Get("/x", handler)
				return r
			},
		}
		for name, build := range routers {
			t.Run(name, func(t *testing.T) {
				h := build(newLimiter(t))
				for i, client := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
					if w := send(h, "GET", "/x", "10.0.0.1", "X-Forwarded-For", client); w.Code != 200 {
						t.Errorf("client %d behind the load balancer: %d; want 200 (a bucket each)", i, w.Code)
					}
				}
				if w := send(h, "GET", "/x", "10.0.0.1", "X-Forwarded-For", "198.51.100.1"); w.Code != 429 {
					t.Errorf("the first client again: %d; want 429", w.Code)
				}
				if name == "chi" {
					return // chi's RealIP rewrites RemoteAddr for the handler too, and trusts every peer
				}
				if seen != "10.0.0.1:1234" {
					t.Errorf("handler saw RemoteAddr %q; want the peer, 10.0.0.1:1234", seen)
				}
				// From outside the trusted proxies a forged header is
				// not believed: the peer's own bucket.
				if w := send(h, "GET", "/x", "203.0.113.9", "X-Forwarded-For", "198.51.100.2"); w.Code != 200 {
					t.Errorf("forged header from an untrusted peer: %d; want 200 (its own bucket)", w.Code)
				}
				if w := send(h, "GET", "/x", "203.0.113.9", "X-Forwarded-For", "198.51.100.3"); w.Code != 429 {
					t.Errorf("forged header from an untrusted peer, again: %d; want 429 (the peer's bucket)", w.Code)
				}
			})
		}
		t.Run("echo without IPExtractor", func(t *testing.T) {
			e := echo.New()
			e.Use(echoratelimit.Middleware(newLimiter(t)))
			e.GET("/x", func(c echo.Context) error { return c.String(200, "ok") })
			send(e, "GET", "/x", "10.0.0.1", "X-Forwarded-For", "198.51.100.1")
			if w := send(e, "GET", "/x", "10.0.0.1", "X-Forwarded-For", "198.51.100.2"); w.Code != 429 {
				t.Errorf("forged headers without an IPExtractor: %d; want 429 (counted by the peer)", w.Code)
			}
		})
	})
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(fmt.Errorf("%s: %w", s, err))
	}
	return n
}
