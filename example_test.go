package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/redistest"
)

// newRedis starts an embedded Redis with its clock stopped at a fixed time,
// so that the examples' output does not depend on when they run. A real
// application passes a client of its own Redis instead.
//
// The examples give their Limiters a timeout of redistest.DecisionTimeout
// (a minute): the embedded Redis interprets the Lua in Go, which under the race
// detector on a busy machine can take longer than the 100ms default, and the
// output must not depend on the machine's speed. Against a real Redis keep
// the default.
func newRedis() (*redis.Client, func()) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	mr.SetTime(time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	return rdb, func() { rdb.Close(); mr.Close() }
}

// get sends GET path from the client at addr through h and prints the answer.
func get(h http.Handler, path, addr string) {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = addr
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%d remaining=%s retry-after=%s\n", w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("Retry-After"))
}

// Two limits checked in one step: 1,000 requests per minute for the whole
// API, and 2 per second per client IP. A request is counted in both or in
// neither.
func Example() {
	rdb, done := newRedis() // rdb := redis.NewClient(&redis.Options{Addr: ..., ContextTimeoutEnabled: true})
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1000, ratelimit.Global()),
		ratelimit.Per(time.Second, 2, ratelimit.ClientIP()),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout)) // the default, 100ms, suits a real Redis: see newRedis
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	get(h, "/", "203.0.113.7:5000")
	get(h, "/", "203.0.113.7:5001")
	get(h, "/", "203.0.113.7:5002")
	get(h, "/", "198.51.100.2:6000")
	// Output:
	// 200 remaining=1 retry-after=
	// 200 remaining=0 retry-after=
	// 429 remaining=0 retry-after=1
	// 200 remaining=1 retry-after=
}

// Allow limits anything, not only HTTP requests: here, jobs per tenant, with a
// per-second and a per-hour limit on the same tenant, and a job that costs 5.
func ExampleLimiter_Allow() {
	rdb, done := newRedis()
	defer done()

	// Allow is given the ids; the limits' Keys matter only to the middleware.
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Second, 10, ratelimit.Global()).Named("jobs-per-second"),
		ratelimit.Per(time.Hour, 12, ratelimit.Global()).Named("jobs-per-hour"),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	for _, cost := range []int{5, 5, 5} {
		res, err := limiter.Allow(context.Background(), []string{"acme", "acme"}, cost)
		if err != nil {
			log.Fatal(err) // Redis is down or too slow: the caller decides
		}
		fmt.Printf("allowed=%v remaining=%d denied-by=%q retry-after=%v\n", res.Allowed, res.Remaining, res.DeniedBy, res.RetryAfter)
	}
	// Output:
	// allowed=true remaining=5 denied-by="" retry-after=0s
	// allowed=true remaining=0 denied-by="" retry-after=0s
	// allowed=false remaining=2 denied-by="jobs-per-hour" retry-after=1h0m0s
}

// WithRoutes gives one route a tighter limit of its own. A request to
// /login is checked against the app-wide limit and the login limit in one
// step, so a login the tighter limit denies does not use up the app-wide
// quota.
func ExampleWithRoutes() {
	rdb, done := newRedis()
	defer done()

	api, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()).Named("api"),
	}, ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
		"GET /login": {Limits: []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("login")}},
	}), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mux := http.NewServeMux()
	mux.Handle("GET /", ok)
	mux.Handle("GET /login", ok)
	h := api.Handler(mux) // it looks the route up, then decides

	get(h, "/login", "203.0.113.7:5000")
	get(h, "/login", "203.0.113.7:5000")
	get(h, "/", "203.0.113.7:5000") // 98 left: only the admitted login counted
	// Output:
	// 200 remaining=0 retry-after=
	// 429 remaining=0 retry-after=60
	// 200 remaining=98 retry-after=
}

// Health checks and metrics scrapes pass undecided: no Redis call, no
// count, no headers. Several WithSkip options add up.
func ExampleWithSkip() {
	rdb, done := newRedis()
	defer done()

	api, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("api"),
	}, ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/metrics" }),
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := api.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	get(h, "/healthz", "203.0.113.7:5000")
	get(h, "/metrics", "203.0.113.7:5000")
	get(h, "/", "203.0.113.7:5000")
	get(h, "/", "203.0.113.7:5000")
	// Output:
	// 200 remaining= retry-after=
	// 200 remaining= retry-after=
	// 200 remaining=0 retry-after=
	// 429 remaining=0 retry-after=60
}

// The monitoring network and one IPv6 host pass undecided. The listed IPv6
// address is matched on its own, not with the /64 the limit counts it in.
func ExampleWithAllowList() {
	rdb, done := newRedis()
	defer done()

	ip := ratelimit.ClientIP()
	api, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ip)},
		ratelimit.WithAllowList(ip, "192.0.2.0/24", "2001:db8::7"),
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := api.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	get(h, "/", "192.0.2.10:5000")
	get(h, "/", "192.0.2.10:5000")
	get(h, "/", "[2001:db8::7]:5000")
	get(h, "/", "[2001:db8::8]:5000") // the same /64, not listed
	get(h, "/", "[2001:db8::8]:5000")
	// Output:
	// 200 remaining= retry-after=
	// 200 remaining= retry-after=
	// 200 remaining= retry-after=
	// 200 remaining=0 retry-after=
	// 429 remaining=0 retry-after=60
}

// sendVia sends GET / from peer with header set to value through h, and
// prints the status.
func sendVia(h http.Handler, peer, header, value string) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = peer
	r.Header.Set(header, value)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code)
}

// Behind a load balancer in a private network, every connection comes
// from a private address, and the balancer reports the client in
// X-Forwarded-For.
func ExampleTrustPrivateNetworks() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustPrivateNetworks())),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	sendVia(h, "10.0.0.5:1234", "X-Forwarded-For", "198.51.100.7")    // client 198.51.100.7
	sendVia(h, "192.168.1.9:1234", "X-Forwarded-For", "198.51.100.7") // the same client, another balancer
	sendVia(h, "10.0.0.5:1234", "X-Forwarded-For", "198.51.100.8")    // another client
	sendVia(h, "203.0.113.50:999", "X-Forwarded-For", "198.51.100.9") // a public peer: the header is ignored
	sendVia(h, "203.0.113.50:999", "X-Forwarded-For", "198.51.100.10")
	// Output:
	// 200
	// 429
	// 200
	// 200
	// 429
}

// Behind Cloudflare, pass its published ranges (https://www.cloudflare.com/ips/),
// loaded with your configuration so that they stay current; the client is
// read from CF-Connecting-IP.
func ExampleTrustCloudflare() {
	rdb, done := newRedis()
	defer done()

	cloudflare := []string{"173.245.48.0/20", "103.21.244.0/22", "2400:cb00::/32"} // ...: the whole list
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustCloudflare(cloudflare...))),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	sendVia(h, "173.245.48.1:443", "CF-Connecting-IP", "198.51.100.7")
	sendVia(h, "[2400:cb00::1]:443", "CF-Connecting-IP", "198.51.100.7") // the same client
	sendVia(h, "203.0.113.50:999", "CF-Connecting-IP", "198.51.100.8")   // not Cloudflare: the header is ignored
	sendVia(h, "203.0.113.50:999", "CF-Connecting-IP", "198.51.100.9")
	// Output:
	// 200
	// 429
	// 200
	// 429
}

// A limiter that counts by ClientIP() but receives requests through a
// proxy it does not trust counts all the proxy's clients together. With a
// logger it says so there, once; without one, through slog's default
// logger.
func ExampleWithLogger_untrustedProxy() {
	rdb, done := newRedis()
	defer done()

	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "remedy" {
				return slog.Attr{} // left out of the example
			}
			return a
		},
	}))
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 100, ratelimit.ClientIP()),
	}, ratelimit.WithLogger(logger, false), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	sendVia(h, "10.0.0.5:1234", "X-Forwarded-For", "198.51.100.7")
	sendVia(h, "10.0.0.5:1234", "X-Forwarded-For", "198.51.100.8")
	// Output:
	// level=WARN msg="ratelimit: requests arrive through a proxy that is not trusted: every client behind it shares one limit, the proxy's address" header=X-Forwarded-For warning=untrusted_proxy
	// 200
	// 200
}

// Behind a load balancer every connection comes from the balancer. Trust it,
// and only it, to report the client's address in X-Forwarded-For.
func ExampleClientIP() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustProxies("10.0.0.0/8"))),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	send := func(peer, xff string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code)
	}
	send("10.0.0.5:1234", "198.51.100.7")              // the balancer reports client 198.51.100.7
	send("10.0.0.5:1234", "203.0.113.9, 198.51.100.7") // the same client, with a forged first hop
	send("198.51.100.7:999", "203.0.113.50")           // direct connection: the header is ignored
	// Output:
	// 200
	// 429
	// 429
}

// Plans give the clients of one limit their own quotas: here the default
// plan admits 2 requests a minute per user, "pro" 5, and "internal" is
// not limited. The plan comes from the request's context, where an
// authentication middleware would put it.
// Burst is a rate with a burst: here 2 jobs a second per customer, up to
// 3 at once. The burst is admitted at once; the next job fits when a unit
// has drained, half a second later, and Retry-After says so exactly. The
// headers give the burst as the quota, per the time it takes to refill.
func ExampleBurst() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Burst(time.Second, 2, 3, ratelimit.Global()).Named("jobs"),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	for range 4 {
		res, err := limiter.Allow(context.Background(), []string{"acme"}, 1)
		if err != nil {
			log.Fatal(err)
		}
		// (Rounded: the example's Redis clock runs on by microseconds.)
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", res.Allowed, res.Remaining, res.RetryAfter.Round(10*time.Millisecond))
	}
	res, _ := limiter.Status(context.Background(), []string{"acme"}, 1)
	fmt.Printf("quota %d per %v\n", res.Limits[0].Quota, res.Limits[0].Window)
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=500ms
	// quota 3 per 1.5s
}

func ExampleLimit_Tiered() {
	rdb, done := newRedis()
	defer done()

	type planKey struct{}
	users := ratelimit.Per(time.Minute, 2, ratelimit.Header("X-User")).Named("user").Tiered(ratelimit.Plans{
		Quotas: map[string]int{"pro": 5, "internal": ratelimit.Unlimited},
		Of: func(ctx context.Context, user string) (string, error) {
			plan, _ := ctx.Value(planKey{}).(string)
			return plan, nil
		},
	})
	api, err := ratelimit.New(rdb, []ratelimit.Limit{users},
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit|ratelimit.HeadersIETF),
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := api.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, c := range []struct{ user, plan string }{{"ann", ""}, {"bob", "pro"}, {"ops", "internal"}} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", c.user)
		r = r.WithContext(context.WithValue(r.Context(), planKey{}, c.plan))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s: %d limit=%q policy=%s\n", c.user, w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// ann: 200 limit="2" policy="user";q=2;w=60
	// bob: 200 limit="5" policy="user.pro";q=5;w=60
	// ops: 200 limit="" policy=
}

// The application writes its own 429 and 503; the rate-limit headers and
// Retry-After are set before it is called.
func ExampleWithHandlers() {
	rdb, done := newRedis()
	defer done()

	api, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.ClientIP()).Named("api")},
		ratelimit.WithHandlers(ratelimit.Handlers{Denied: func(w http.ResponseWriter, r *http.Request, res ratelimit.Result) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, `{"error":"slow down","limit":%q}`, res.DeniedBy)
		}}),
		ratelimit.WithHandlers(ratelimit.Handlers{Unavailable: func(w http.ResponseWriter, r *http.Request, err error) {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":"try again soon"}`)
		}}),
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := api.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	send := func(addr string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d retry-after=%s %s\n", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	send("203.0.113.7:5000")
	send("203.0.113.7:5000")
	rdb.Close() // Redis is out of reach: the next request cannot be decided
	send("203.0.113.8:5000")
	// Output:
	// 200 retry-after= ok
	// 429 retry-after=60 {"error":"slow down","limit":"api"}
	// 503 retry-after=1 {"error":"try again soon"}
}

// Limits behind authentication: a per-IP Limiter in front of it limits
// floods of bad credentials; a per-user Limiter behind it counts each user,
// known only there. An authenticated request is counted once in each.
func ExampleLimiter_Handler_behindAuthentication() {
	rdb, done := newRedis()
	defer done()

	type userKey struct{}
	perIP, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 3, ratelimit.ClientIP()).Named("ip")},
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	perUser, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, 1, ratelimit.User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(userKey{}).(string); return u, ok })).Named("user")},
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			user := r.Header.Get("X-Token") // a real app checks a credential
			if user == "" {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
		})
	}
	mux := http.NewServeMux()
	mux.Handle("GET /me", auth(perUser.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))))
	h := perIP.Handler(mux)

	for _, token := range []string{"", "ann", "ann", ""} {
		r := httptest.NewRequest("GET", "/me", nil)
		r.Header.Set("X-Token", token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("token=%q: %d\n", token, w.Code)
	}
	// Output:
	// token="": 401
	// token="ann": 200
	// token="ann": 429
	// token="": 429
}

// A login limit that blocks a client for 15 minutes once it is over: the
// third attempt within a minute is denied, and so is every attempt of
// that client until the block ends, on every replica, however long ago
// its attempts were. Reset lifts the block.
func ExampleLimit_Block() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 2, ratelimit.ClientIP()).Named("login").Block(15 * time.Minute),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	ip := []string{"203.0.113.7"}
	for range 3 {
		res, err := limiter.Allow(ctx, ip, 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Allowed, res.RetryAfter.Round(time.Minute), !res.Limits[0].Blocked.IsZero())
	}
	if err := limiter.Reset(ctx, ip); err != nil {
		log.Fatal(err)
	}
	res, _ := limiter.Allow(ctx, ip, 1)
	fmt.Println("after Reset:", res.Allowed)
	// Output:
	// true 0s false
	// true 0s false
	// false 15m0s true
	// after Reset: true
}

// A quota per billing month: each customer's month starts on the day it
// subscribed (StartOf), in its time zone, and the quota resets exactly at
// that boundary. Here a customer subscribed on January 31 in Berlin: its
// February period ends on February 28 at midnight Berlin time, and the
// headers say so (X-RateLimit-Reset: Feb 28 00:00 and Mar 31 00:00 in
// Berlin). The Limiter's clock is set (WithClock) so that the output does
// not depend on when the example runs.
func ExampleCalendar() {
	rdb, done := newRedis()
	defer done()

	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		log.Fatal(err)
	}
	subscribedAt := func(ctx context.Context, customer string) (time.Time, error) {
		return time.Date(2026, 1, 31, 0, 0, 0, 0, berlin), nil // the customer's record, in a real application
	}
	// The example's clock, read by the Limiter's own goroutines too.
	var now atomic.Pointer[time.Time]
	monthEnd := time.Date(2027, 2, 27, 23, 0, 0, 0, time.UTC) // Feb 28, 00:00 in Berlin
	now.Store(&monthEnd)
	monthly := ratelimit.Calendar(ratelimit.Period{Months: 1, StartOf: subscribedAt}, 2, ratelimit.Header("X-Customer"))
	api, err := ratelimit.New(rdb, []ratelimit.Limit{monthly},
		ratelimit.WithHeaders(ratelimit.HeadersXRateLimit|ratelimit.HeadersIETF),
		ratelimit.WithClock(func() time.Time { return *now.Load() }),
		ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := api.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, at := range []time.Time{monthEnd.Add(-2 * time.Hour), monthEnd.Add(-time.Hour), monthEnd.Add(-time.Second), monthEnd} {
		now.Store(&at)
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Customer", "acme")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s: %d remaining=%s reset=%s retry-after=%s policy=%s\n", at.In(berlin).Format("Jan 2 15:04:05"), w.Code,
			w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("X-RateLimit-Reset"), w.Header().Get("Retry-After"),
			w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// Feb 27 22:00:00: 200 remaining=1 reset=1803769200 retry-after= policy="header-per-1mo";q=2
	// Feb 27 23:00:00: 200 remaining=0 reset=1803769200 retry-after= policy="header-per-1mo";q=2
	// Feb 27 23:59:59: 429 remaining=0 reset=1803769200 retry-after=1 policy="header-per-1mo";q=2
	// Feb 28 00:00:00: 200 remaining=1 reset=1806444000 retry-after= policy="header-per-1mo";q=2
}

// Charge charges a streamed response as it streams: here a stand-in
// model's tokens, 3 a chunk, against a user's budget of 10 tokens a
// minute that stops. The request is admitted at 1 (its prompt); the
// charge that spends the budget cancels the request's context, which
// ends the model's stream, and the response ends with what was sent.
func ExampleCharge() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 10, ratelimit.Header("X-User")).Named("tokens").Stopping(),
	}, ratelimit.WithSettle(nil), ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	// model streams its chunks until ctx ends.
	model := func(ctx context.Context) <-chan string {
		out := make(chan string)
		go func() {
			defer close(out)
			for i := 0; ; i++ {
				select {
				case out <- fmt.Sprintf("chunk %d", i):
				case <-ctx.Done():
					return
				}
			}
		}()
		return out
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for chunk := range model(r.Context()) {
			fmt.Fprintln(w, chunk)
			if err := ratelimit.Charge(r.Context(), 3); err != nil {
				fmt.Println("charge:", err)
			}
			if r.Context().Err() != nil {
				fmt.Println("stopped:", context.Cause(r.Context()))
				return
			}
		}
	}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", "ada")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Print(w.Code, "\n", w.Body.String())
	// Output:
	// charge: ratelimit: a limit's budget is spent: limit tokens holds 10 of its 10 units
	// stopped: ratelimit: a limit's budget is spent: limit tokens holds 10 of its 10 units
	// 200
	// chunk 0
	// chunk 1
	// chunk 2
}
