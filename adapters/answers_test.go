package adapters_test

import (
	"bytes"
	"errors"
	"mime"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/redistest"
)

// answer is what a router sends for a 429, a 503 or a 401 (no key) the
// Limiter has no handler of its own for.
type answer struct{ contentType, body string }

// defaultAnswers: plain text from net/http and chi, which have no error
// convention; echo's HTTPErrorHandler's JSON; gin's AbortWithStatusJSON.
var defaultAnswers = map[string]map[int]answer{
	"net/http":    {429: {"text/plain; charset=utf-8", "Too Many Requests\n"}, 503: {"text/plain; charset=utf-8", "Service Unavailable\n"}, 401: {"text/plain; charset=utf-8", "Unauthorized\n"}},
	"chi":         {429: {"text/plain; charset=utf-8", "Too Many Requests\n"}, 503: {"text/plain; charset=utf-8", "Service Unavailable\n"}, 401: {"text/plain; charset=utf-8", "Unauthorized\n"}},
	"echo":        {429: {"application/json", `{"message":"Too Many Requests"}` + "\n"}, 503: {"application/json", `{"message":"Service Unavailable"}` + "\n"}, 401: {"application/json", `{"message":"Unauthorized"}` + "\n"}},
	"gin":         {429: {"application/json; charset=utf-8", `{"error":"Too Many Requests"}`}, 503: {"application/json; charset=utf-8", `{"error":"Service Unavailable"}`}, 401: {"application/json; charset=utf-8", `{"error":"Unauthorized"}`}},
	"third party": {429: {"application/json", `{"error":"Too Many Requests"}` + "\n"}, 503: {"application/json", `{"error":"Service Unavailable"}` + "\n"}, 401: {"application/json", `{"error":"Unauthorized"}` + "\n"}},
}

// TestDefaultAnswers: a denial and a failure the Limiter has no handler for
// are answered in each router's way, with the rate-limit headers and
// Retry-After.
func TestDefaultAnswers(t *testing.T) {
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) {
			want := defaultAnswers[rt.name]
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				h := rt.build(perIP(t, rdb, 1, opts...))
				if w := send(h, "GET", "/users/1", "192.0.2.1"); w.Code != 200 {
					t.Fatalf("first request: %d %q", w.Code, w.Body)
				}
				w := send(h, "GET", "/users/1", "192.0.2.1")
				got := w.Result().Header
				if w.Code != 429 || !sameType(got, want[429].contentType) || w.Body.String() != want[429].body {
					t.Errorf("denied: %d %q %q, want 429 %q %q", w.Code, got.Get("Content-Type"), w.Body, want[429].contentType, want[429].body)
				}
				if got.Get("X-RateLimit-Limit") != "1" || got.Get("X-RateLimit-Remaining") != "0" ||
					got.Get("X-RateLimit-Reset") == "" || got.Get("Retry-After") != "60" {
					t.Errorf("denied: headers %v", got)
				}
			})
			// A Key that cannot identify the request: not a failure, under
			// any failure mode, but 401 in the router's way, with no
			// rate-limit headers and no Retry-After (waiting does not help).
			for _, mode := range []ratelimit.FailureMode{ratelimit.FailClosed, ratelimit.FailOpen, ratelimit.FailLocal} {
				t.Run("no key "+mode.String(), func(t *testing.T) {
					forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
						l, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key"))},
							append(opts, ratelimit.WithTimeout(redistest.DecisionTimeout), ratelimit.WithFailureMode(mode))...)
						if err != nil {
							t.Fatal(err)
						}
						w := send(rt.build(l), "GET", "/users/1", "192.0.2.1")
						got := w.Result().Header
						if w.Code != 401 || !sameType(got, want[401].contentType) || w.Body.String() != want[401].body ||
							got.Get("Retry-After") != "" || got.Get("X-RateLimit-Limit") != "" {
							t.Errorf("%v, no key: %d %v %q, want 401 %q %q without Retry-After or limit headers", mode, w.Code, got, w.Body, want[401].contentType, want[401].body)
						}
					})
				})
			}
			// A Redis that is gone, under FailClosed (the default).
			failures := map[string]func(t *testing.T) *ratelimit.Limiter{
				"redis": func(t *testing.T) *ratelimit.Limiter {
					mr := miniredis.RunT(t)
					rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
					t.Cleanup(func() { _ = rdb.Close() })
					mr.Close() // connections are refused at once
					return perIP(t, rdb, 1)
				},
			}
			for name, limiter := range failures {
				t.Run(name, func(t *testing.T) {
					w := send(rt.build(limiter(t)), "GET", "/users/1", "192.0.2.1")
					got := w.Result().Header
					if w.Code != 503 || !sameType(got, want[503].contentType) || w.Body.String() != want[503].body || got.Get("Retry-After") != "1" {
						t.Errorf("failed: %d %q %q retry-after=%q, want 503 %q %q 1", w.Code, got.Get("Content-Type"), w.Body,
							got.Get("Retry-After"), want[503].contentType, want[503].body)
					}
				})
			}
		})
	}
}

// TestOwnHandlersWin: a Limiter's own handlers answer in every router, in
// place of the router's conventions.
func TestOwnHandlersWin(t *testing.T) {
	unavailable := ratelimit.WithHandlers(ratelimit.Handlers{Unavailable: func(w http.ResponseWriter, _ *http.Request, err error) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("ours: " + err.Error()))
	}})
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				h := rt.build(perIP(t, rdb, 1, append(opts, ratelimit.WithHandlers(ratelimit.Handlers{Denied: ratelimit.ProblemDetails}))...))
				send(h, "GET", "/users/1", "192.0.2.1")
				w := send(h, "GET", "/users/1", "192.0.2.1")
				if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" ||
					!strings.Contains(w.Body.String(), `"violated-policies":["ip"]`) || w.Header().Get("Retry-After") != "60" {
					t.Errorf("denied: %d %v %q, want ProblemDetails' 429", w.Code, w.Header(), w.Body)
				}
			})
			mr := miniredis.RunT(t)
			gone := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
			t.Cleanup(func() { _ = gone.Close() })
			mr.Close()
			w := send(rt.build(perIP(t, gone, 1, unavailable)), "GET", "/users/1", "192.0.2.1")
			if w.Code != 503 || !strings.HasPrefix(w.Body.String(), "ours: ") || w.Header().Get("Retry-After") != "1" {
				t.Errorf("failed: %d %v %q, want our 503", w.Code, w.Header(), w.Body)
			}
			l, err := ratelimit.New(redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr(), ContextTimeoutEnabled: true}),
				[]ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key"))}, ratelimit.WithTimeout(redistest.DecisionTimeout), unavailable,
				ratelimit.WithHandlers(ratelimit.Handlers{MissingKey: func(w http.ResponseWriter, _ *http.Request, err error) {
					w.WriteHeader(http.StatusForbidden)
					_, _ = w.Write([]byte("ours: " + err.Error()))
				}}))
			if err != nil {
				t.Fatal(err)
			}
			w = send(rt.build(l), "GET", "/users/1", "192.0.2.1")
			if w.Code != 403 || !strings.HasPrefix(w.Body.String(), "ours: ") || !strings.Contains(w.Body.String(), "X-Api-Key") || w.Header().Get("Retry-After") != "" {
				t.Errorf("no key: %d %v %q, want our 403", w.Code, w.Header(), w.Body)
			}
		})
	}
}

// stoppedMiniredis returns a client of a miniredis whose clock stands
// still, so that Retry-After is a whole window.
func stoppedMiniredis(t *testing.T) *redis.Client {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestEchoErrorHandler: the app's HTTPErrorHandler sees the limiter's
// errors, and the headers it set reach the client.
func TestEchoErrorHandler(t *testing.T) {
	rdb := stoppedMiniredis(t)
	var seen []error
	build := func(l *ratelimit.Limiter) *echo.Echo {
		seen = nil
		e := echo.New()
		e.HTTPErrorHandler = func(err error, c echo.Context) {
			seen = append(seen, err)
			var he *echo.HTTPError
			if errors.As(err, &he) {
				_ = c.String(he.Code, "app error page")
			}
		}
		e.Use(echoratelimit.Middleware(l))
		e.GET("/users/:id", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
		return e
	}
	e := build(perIP(t, rdb, 1))
	send(e, "GET", "/users/1", "192.0.2.1")
	w := send(e, "GET", "/users/1", "192.0.2.1")
	var he *echo.HTTPError
	if len(seen) != 1 || !errors.As(seen[0], &he) || he.Code != 429 {
		t.Errorf("the error handler saw %v, want one echo.HTTPError 429", seen)
	}
	if w.Code != 429 || w.Body.String() != "app error page" || w.Header().Get("X-RateLimit-Remaining") != "0" || w.Header().Get("Retry-After") != "60" {
		t.Errorf("denied: %d %v %q", w.Code, w.Header(), w.Body)
	}

	l, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key"))}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	w = send(build(l), "GET", "/users/1", "192.0.2.1")
	if len(seen) != 1 || !errors.As(seen[0], &he) || he.Code != 401 || !errors.Is(seen[0], ratelimit.ErrNoKey) {
		t.Errorf("the error handler saw %v, want one echo.HTTPError 401 wrapping ErrNoKey", seen)
	}
	if w.Code != 401 || w.Body.String() != "app error page" || w.Header().Get("Retry-After") != "" {
		t.Errorf("failed: %d %v %q", w.Code, w.Header(), w.Body)
	}
}

// TestGinErrors: gin's error list gets the limiter's errors as private
// errors: gin's Logger prints them, and middleware that renders public
// errors leaves the response alone.
func TestGinErrors(t *testing.T) {
	rdb := stoppedMiniredis(t)
	var errs []*gin.Error
	var log bytes.Buffer
	build := func(l *ratelimit.Limiter) *gin.Engine {
		gin.SetMode(gin.ReleaseMode)
		log.Reset()
		g := gin.New()
		g.Use(gin.LoggerWithWriter(&log), gin.ErrorLoggerT(gin.ErrorTypePublic), func(c *gin.Context) {
			c.Next()
			errs = append(errs[:0], c.Errors...)
		}, ginratelimit.Middleware(l))
		g.GET("/users/:id", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		return g
	}
	g := build(perIP(t, rdb, 1))
	send(g, "GET", "/users/1", "192.0.2.1")
	w := send(g, "GET", "/users/1", "192.0.2.1")
	if len(errs) != 1 || !errors.Is(errs[0], ginratelimit.ErrTooManyRequests) || errs[0].Type != gin.ErrorTypePrivate {
		t.Errorf("c.Errors = %v, want ErrTooManyRequests, private", errs)
	}
	if w.Code != 429 || w.Body.String() != `{"error":"Too Many Requests"}` || !strings.Contains(log.String(), "ratelimit: too many requests") {
		t.Errorf("denied: %d %q; log %q", w.Code, w.Body, log.String())
	}

	l, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Api-Key"))}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	w = send(build(l), "GET", "/users/1", "192.0.2.1")
	if len(errs) != 1 || !errors.Is(errs[0], ratelimit.ErrNoKey) || errs[0].Type != gin.ErrorTypePrivate {
		t.Errorf("c.Errors = %v, want ErrNoKey, private", errs)
	}
	if w.Code != 401 || w.Body.String() != `{"error":"Unauthorized"}` || !strings.Contains(log.String(), "X-Api-Key") {
		t.Errorf("failed: %d %q; log %q", w.Code, w.Body, log.String())
	}
}

// sameType reports whether h's Content-Type is want, or, if want has no
// parameters, of want's media type: echo before v4.12 wrote
// "application/json; charset=UTF-8", later versions "application/json".
func sameType(h http.Header, want string) bool {
	got := h.Get("Content-Type")
	if got == want || strings.Contains(want, ";") {
		return got == want
	}
	t, _, err := mime.ParseMediaType(got)
	return err == nil && t == want
}
