package adapters_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// send serves one request from ip through h, with the headers given as
// name, value pairs.
func send(h http.Handler, method, path, ip string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = ip + ":1234"
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// perIP is a Limiter of one limit, "ip", quota requests a minute per
// client IP.
func perIP(t *testing.T, rdb redis.UniversalClient, quota int, opts ...ratelimit.Option) *ratelimit.Limiter {
	t.Helper()
	opts = append([]ratelimit.Option{ratelimit.WithTimeout(redistest.DecisionTimeout)}, opts...)
	l, err := ratelimit.New(rdb, []ratelimit.Limit{ratelimit.Per(time.Minute, quota, ratelimit.ClientIP()).Named("ip")}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
