package adapters_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
	"github.com/slidinglog/ratelimit/redistest"
)

// slowRelease is a go-redis hook that, once armed, holds the next call
// of the library's code (the release of the request whose handler armed
// it) until another call has completed, or for hold at most: a release
// made after the response would let the client's next request be decided
// while the slot is still held, every time; a release made before the
// response only waits.
type slowRelease struct {
	hold  time.Duration
	armed atomic.Bool
	other chan struct{} // a call completed
}

func newSlowRelease(hold time.Duration) *slowRelease {
	return &slowRelease{hold: hold, other: make(chan struct{}, 1)}
}

func (s *slowRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			if s.armed.CompareAndSwap(true, false) {
				select {
				case <-s.other: // one before this call: not what it waits for
				default:
				}
				select {
				case <-s.other:
				case <-time.After(s.hold):
				}
				return next(ctx, cmd)
			}
		}
		err := next(ctx, cmd)
		s.done()
		return err
	}
}

func (s *slowRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		s.done()
		return err
	}
}

func (s *slowRelease) done() {
	select {
	case s.other <- struct{}{}:
	default:
	}
}

// sequentialRouters serve GET /work with handler through each router,
// the Limiter mounted as usual.
var sequentialRouters = routersServing("/work")

// routedApp is an app of one route served by one router.
type routedApp struct {
	name  string
	build func(l *ratelimit.Limiter, handler http.HandlerFunc) http.Handler
}

// routersServing returns the apps that serve GET path with a handler
// through net/http and each router, the Limiter mounted as usual.
func routersServing(path string) []routedApp {
	return []routedApp{
		{"net/http", func(l *ratelimit.Limiter, handler http.HandlerFunc) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET "+path, handler)
			return l.Handler(mux)
		}},
		{"chi", func(l *ratelimit.Limiter, handler http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(chiratelimit.Middleware(l))
			r.Get(path, handler)
			return r
		}},
		{"echo", func(l *ratelimit.Limiter, handler http.HandlerFunc) http.Handler {
			e := echo.New()
			e.Use(echoratelimit.Middleware(l))
			e.GET(path, echo.WrapHandler(handler))
			return e
		}},
		{"gin", func(l *ratelimit.Limiter, handler http.HandlerFunc) http.Handler {
			gin.SetMode(gin.ReleaseMode)
			g := gin.New()
			g.Use(ginratelimit.Middleware(l))
			g.GET(path, gin.WrapF(handler))
			return g
		}},
	}
}

// TestInFlightSequentialClient: with an in-flight cap of 1, a client that
// sends each request only once it has read the previous response never
// finds its own finished request holding the slot: 100 requests through
// net/http and every router, over a real HTTP server, all 200, on
// miniredis and a real server. Every 25th request's release is held in
// Redis's client until another call completes (at most 300ms): a release
// that runs after the response has gone out lets the next request be
// decided first, and be refused.
func TestInFlightSequentialClient(t *testing.T) {
	for _, rt := range sequentialRouters {
		t.Run(rt.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
				hook := newSlowRelease(300 * time.Millisecond)
				rdb.AddHook(hook)
				l, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.InFlight(1, ratelimit.ClientIP()).Named("conn")},
					append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
				var n atomic.Int64
				srv := httptest.NewServer(rt.build(l, func(w http.ResponseWriter, r *http.Request) {
					if n.Add(1)%25 == 0 {
						hook.armed.Store(true)
					}
					_, _ = io.WriteString(w, "done")
				}))
				t.Cleanup(srv.Close)
				client := srv.Client()
				var refused []int
				for i := range 100 {
					resp, err := client.Get(srv.URL + "/work")
					if err != nil {
						t.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						refused = append(refused, i)
					}
				}
				if len(refused) > 0 {
					t.Errorf("%d of 100 sequential requests refused with a cap of 1 (requests %v)", len(refused), refused)
				}
			})
		})
	}
}
