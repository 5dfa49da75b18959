package adapters_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/store"
)

// admitStore is a store.Store that admits every request with one fixed
// outcome, "3 counted before it, window ending in a minute", without a
// network or a server in the process, so that the benchmark's time and
// allocations are the adapters' and the limiter's, not a store's.
type admitStore struct{ now int64 }

func (s admitStore) Decide(_ context.Context, q *store.Query, out *store.Outcome) error {
	out.Allowed, out.Denier, out.Now = true, -1, s.now
	for i := range out.Replies {
		out.Replies[i] = store.Reply{OK: true, Now: s.now, Count: 3, Reset: s.now + 60e6, Next: s.now}
	}
	return nil
}

func newAdmitStore() admitStore { return admitStore{now: time.Now().UnixMicro()} }

// nopWriter is a ResponseWriter that does not allocate, so that allocs/op
// counts the router and the middleware only.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkAdmitted measures an admitted request through each router, with
// the adapter mounted once and with the same Limiter mounted twice, against
// the router alone ("bare"): what the adapter adds to the router, beyond the
// store's decision (a fixed answer here).
//
//	go test -run '^$' -bench Admitted -benchmem ./adapters/
func BenchmarkAdmitted(b *testing.B) {
	for _, rt := range benchRouters {
		for _, mounts := range []int{0, 1, 2} {
			name := rt.name + "/" + [...]string{"bare", "once", "twice"}[mounts]
			b.Run(name, func(b *testing.B) {
				api, err := ratelimit.New(nil, []ratelimit.Limit{ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("ip")},
					ratelimit.WithStore(newAdmitStore()))
				if err != nil {
					b.Fatal(err)
				}
				h := rt.build(api, mounts)
				r, _ := http.NewRequest("GET", "/users/7", nil)
				r.RemoteAddr = "203.0.113.7:5000"
				w := &nopWriter{h: make(http.Header)}
				h.ServeHTTP(w, r)
				if mounts > 0 && w.h.Get("X-RateLimit-Remaining") != "96" {
					b.Fatalf("not admitted by the store: %v", w.h)
				}
				b.ReportAllocs()
				for b.Loop() {
					r.Pattern = "" // as a new request would have it
					h.ServeHTTP(w, r)
				}
			})
		}
	}
}

// benchRouters serve GET /users/{id} with the Limiter mounted mounts times.
var benchRouters = []struct {
	name  string
	build func(api *ratelimit.Limiter, mounts int) http.Handler
}{
	{"net/http", func(api *ratelimit.Limiter, mounts int) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /users/{id}", ok)
		var h http.Handler = mux
		for range mounts {
			h = api.Handler(h)
		}
		return h
	}},
	{"chi", func(api *ratelimit.Limiter, mounts int) http.Handler {
		r := chi.NewRouter()
		for range mounts {
			r.Use(chiratelimit.Middleware(api))
		}
		r.Get("/users/{id}", ok)
		return r
	}},
	{"echo", func(api *ratelimit.Limiter, mounts int) http.Handler {
		e := echo.New()
		for range mounts {
			e.Use(echoratelimit.Middleware(api))
		}
		e.GET("/users/:id", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
		return e
	}},
	{"gin", func(api *ratelimit.Limiter, mounts int) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		g := gin.New()
		for range mounts {
			g.Use(ginratelimit.Middleware(api))
		}
		g.GET("/users/:id", func(c *gin.Context) { c.String(http.StatusOK, "ok") })
		return g
	}},
}
