package ratelimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/clientip"
	"github.com/slidinglog/ratelimit/redistest"
)

// The README's proxy section: one complete setup per common front end.
// Each example lets three clients through one proxy (one bucket each) and
// denies the first client's second request.

// behind sends GET / from the proxy at peer for each client, with the
// header the proxy sets (its value made by value), and prints the
// statuses.
func behind(h http.Handler, peer, header string, value func(client string) string, clients ...string) {
	codes := make([]string, len(clients))
	for i, c := range clients {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set(header, value(c))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes[i] = fmt.Sprint(w.Code)
	}
	fmt.Println(strings.Join(codes, " "))
}

// AWS Application Load Balancer (and any cloud load balancer in the app's
// private network, such as Azure Application Gateway): the balancer
// connects from an address of its subnets and appends the client's
// address to X-Forwarded-For. Trust the subnets the balancer runs in (here
// the VPC, 10.0.0.0/16), and nothing else.
func ExampleTrustProxies_awsALB() {
	rdb, done := newRedis() // rdb := redis.NewClient(&redis.Options{Addr: ..., ContextTimeoutEnabled: true})
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustProxies("10.0.0.0/16"))),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	// The client sent X-Forwarded-For: 6.6.6.6 itself, to pick its key:
	// the balancer appends the real address, which is the one read.
	behind(h, "10.0.12.34:41000", "X-Forwarded-For", func(c string) string { return "6.6.6.6, " + c },
		"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.1")
	// Output:
	// 200 200 200 429
}

// Google Cloud external Application Load Balancer: requests come from
// Google's front ends, 35.191.0.0/16 and 130.211.0.0/22, with
// X-Forwarded-For: <client>, <the load balancer's own IP>. Trust both:
// the front ends' ranges and the forwarding rule's address (here
// 203.0.113.10).
func ExampleTrustProxies_gcpLoadBalancer() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustProxies("35.191.0.0/16", "130.211.0.0/22", "203.0.113.10"))),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	behind(h, "35.191.8.20:52000", "X-Forwarded-For", func(c string) string { return c + ", 203.0.113.10" },
		"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.1")
	// Output:
	// 200 200 200 429
}

// nginx on the app's host, configured with
//
//	location / {
//	    proxy_pass http://127.0.0.1:8080;
//	    proxy_set_header X-Real-IP $remote_addr;
//	}
//
// Trust the loopback addresses nginx connects from, and read X-Real-IP,
// which nginx overwrites (with proxy_set_header X-Forwarded-For
// $proxy_add_x_forwarded_for instead, leave ProxyHeader out). The app must
// listen on 127.0.0.1 only, or any host could send X-Real-IP.
func ExampleProxyHeader_nginx() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustProxies("127.0.0.1", "::1"), clientip.ProxyHeader("X-Real-IP"))),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	behind(h, "127.0.0.1:39000", "X-Real-IP", func(c string) string { return c },
		"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.1")
	// Output:
	// 200 200 200 429
}

// Cloudflare: trust Cloudflare's published ranges (load them from
// https://www.cloudflare.com/ips/ with your configuration; two are shown)
// and read CF-Connecting-IP. A request that reaches the app without
// Cloudflare is counted by its own address, its CF-Connecting-IP ignored.
func ExampleTrustCloudflare_behindCloudflare() {
	rdb, done := newRedis()
	defer done()

	cloudflare := []string{"173.245.48.0/20", "2400:cb00::/32"} // ... all of https://www.cloudflare.com/ips/
	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.TrustCloudflare(cloudflare...))),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	h := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	behind(h, "173.245.48.7:443", "CF-Connecting-IP", func(c string) string { return c },
		"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.1")
	// Not through Cloudflare: the forged header is ignored, both requests
	// are the peer's.
	behind(h, "203.0.113.9:5000", "CF-Connecting-IP", func(c string) string { return c },
		"198.51.100.4", "198.51.100.5")
	// Output:
	// 200 200 200 429
	// 200 429
}

// The proxies configured once, in the router: middleware in front of the
// limiter that rewrites RemoteAddr from a proxy header it trusts (chi's
// middleware.RealIP, or your own as here), and ClientIP(clientip.FromRouter())
// counts by what it resolved. The gin and echo adapters hand over gin's
// c.ClientIP() and echo's c.RealIP() the same way.
func ExampleFromRouter() {
	rdb, done := newRedis()
	defer done()

	limiter, err := ratelimit.New(rdb, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 1, ratelimit.ClientIP(clientip.FromRouter())),
	}, ratelimit.WithTimeout(redistest.DecisionTimeout))
	if err != nil {
		log.Fatal(err)
	}
	// realIP trusts X-Real-IP from the load balancer at 10.0.0.1 only.
	realIP := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ip := r.Header.Get("X-Real-IP"); ip != "" && strings.HasPrefix(r.RemoteAddr, "10.0.0.1:") {
				r.RemoteAddr = ip
			}
			next.ServeHTTP(w, r)
		})
	}
	h := realIP(limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	behind(h, "10.0.0.1:40000", "X-Real-IP", func(c string) string { return c },
		"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.1")
	// Output:
	// 200 200 200 429
}
