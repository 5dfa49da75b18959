package ratelimit

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
	"github.com/slidinglog/ratelimit/store"
)

// redisField is one drawn redisstore.Options field value and what it means:
// valid is false for a value New must refuse.
type redisField[T any] struct {
	v     T
	valid bool
}

// drawDuration draws a duration field: 0 (keep), -1 (off, if offable),
// another negative (an error), or a positive value.
func drawDuration(t *rapid.T, label string, offable bool) redisField[time.Duration] {
	switch rapid.IntRange(0, 3).Draw(t, label+" kind") {
	case 0:
		return redisField[time.Duration]{0, true}
	case 1:
		return redisField[time.Duration]{-1, offable}
	case 2:
		return redisField[time.Duration]{-time.Duration(rapid.Int64Range(2, int64(time.Hour)).Draw(t, label)), false}
	}
	return redisField[time.Duration]{time.Duration(rapid.Int64Range(1, int64(time.Hour)).Draw(t, label)), true}
}

// TestRedisStoreOptions: the options of a redisstore.Store given with
// WithStore are the Limiter's configuration, a zero field keeping the
// default, -1 turning off what can be off; every invalid field is an
// error from redisstore.New that names it.
func TestRedisStoreOptions(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		want := defaultConfig()
		var bad []string // the fields New must name
		var o redisstore.Options
		switch rapid.IntRange(0, 2).Draw(t, "prefix kind") {
		case 1:
			o.Prefix = rapid.StringMatching(`[a-z:]{1,8}`).Draw(t, "prefix")
			want.prefix = o.Prefix
		case 2:
			o.Prefix = rapid.StringMatching(`[a-z:]{0,4}[{}][a-z:{}]{0,4}`).Draw(t, "prefix")
			bad = append(bad, "Options.Prefix")
		}
		switch rapid.IntRange(0, 3).Draw(t, "failures kind") {
		case 1:
			o.BreakerFailures = -1
			want.breakerFailures = 0
		case 2:
			o.BreakerFailures = rapid.IntRange(-100, -2).Draw(t, "failures")
			bad = append(bad, "Options.BreakerFailures")
		case 3:
			o.BreakerFailures = rapid.IntRange(1, 100).Draw(t, "failures")
			want.breakerFailures = o.BreakerFailures
		}
		var f redisField[time.Duration]
		if f = drawDuration(t, "cool-down", false); f.valid && f.v != 0 {
			want.breakerCoolDown = f.v
		} else if !f.valid {
			bad = append(bad, "Options.BreakerCoolDown")
		}
		o.BreakerCoolDown = f.v
		if f = drawDuration(t, "deny cache", true); f.valid && f.v != 0 {
			want.denyCache = max(f.v, 0)
		} else if !f.valid {
			bad = append(bad, "Options.DenyCache")
		}
		o.DenyCache = f.v
		if f = drawDuration(t, "refresh", true); f.valid && f.v != 0 {
			want.opsRefresh = max(f.v, 0)
		} else if !f.valid {
			bad = append(bad, "Options.OperatorRefresh")
		}
		o.OperatorRefresh = f.v
		if o.SingleSlot = rapid.Bool().Draw(t, "single slot"); o.SingleSlot {
			want.singleSlot = true
		}
		want.localBytes = store.DefaultLocalMemory
		switch rapid.IntRange(0, 2).Draw(t, "local memory kind") {
		case 1:
			o.LocalMemory = rapid.Int64Range(store.MinLocalMemory, 1<<30).Draw(t, "local memory")
			want.localBytes = o.LocalMemory
		case 2:
			o.LocalMemory = rapid.Int64Range(-1<<20, store.MinLocalMemory-1).Filter(func(n int64) bool { return n != 0 }).Draw(t, "local memory")
			bad = append(bad, "Options.LocalMemory")
		}
		rs, err := redisstore.New(stubClient{}, o)
		if len(bad) > 0 {
			for _, field := range bad {
				if err == nil || !strings.Contains(err.Error(), field) {
					t.Fatalf("redisstore.New: %v; want an error naming %s", err, field)
				}
			}
			return
		}
		if err != nil {
			t.Fatalf("redisstore.New: %v", err)
		}
		lim, err := New(nil, []Limit{Per(time.Minute, 3, Header("X-Id")).Named("opts")}, WithStore(rs))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer lim.Close()
		got := lim.cfg
		type mech struct {
			prefix                   string
			failures                 int
			coolDown, deny, opsEvery time.Duration
			singleSlot               bool
			localBytes               int64
		}
		g := mech{got.prefix, got.breakerFailures, got.breakerCoolDown, got.denyCache, got.opsRefresh, got.singleSlot, got.localBytes}
		w := mech{want.prefix, want.breakerFailures, want.breakerCoolDown, want.denyCache, want.opsRefresh, want.singleSlot, want.localBytes}
		if g != w {
			t.Fatalf("configuration %+v, want %+v", g, w)
		}
	})
}

// TestHandlers: several WithHandlers merge field by field, a nil field
// keeping what an earlier one gave or the default answer; each answer is
// the last handler given for it.
func TestHandlers(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.newClient(t)
		n := 0
		rapid.Check(t, func(t *rapid.T) {
			n++
			// want: the body each answer writes; "" for the default's.
			var want [3]string
			var opts []Option
			for i := range rapid.IntRange(0, 3).Draw(t, "options") {
				var h Handlers
				id := "h" + strconv.Itoa(i)
				if rapid.Bool().Draw(t, id+" denied") {
					want[0] = id + " denied"
					h.Denied = func(w http.ResponseWriter, _ *http.Request, _ Result) {
						w.WriteHeader(http.StatusTooManyRequests)
						_, _ = w.Write([]byte(id + " denied"))
					}
				}
				if rapid.Bool().Draw(t, id+" unavailable") {
					want[1] = id + " unavailable"
					h.Unavailable = func(w http.ResponseWriter, _ *http.Request, _ error) {
						w.WriteHeader(http.StatusServiceUnavailable)
						_, _ = w.Write([]byte(id + " unavailable"))
					}
				}
				if rapid.Bool().Draw(t, id+" missing key") {
					want[2] = id + " missing key"
					h.MissingKey = func(w http.ResponseWriter, _ *http.Request, _ error) {
						w.WriteHeader(http.StatusUnauthorized)
						_, _ = w.Write([]byte(id + " missing key"))
					}
				}
				opts = append(opts, WithHandlers(h))
			}
			opts = append(opts, WithLogger(slog.New(slog.DiscardHandler), false))
			limits := []Limit{Per(time.Minute, 1, Header("X-Id")).Named("h" + strconv.Itoa(n))}
			lim, err := New(c, limits, append(opts, WithTimeout(redistest.DecisionTimeout), withRedis(redisstore.Options{OperatorRefresh: -1}))...)
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			down, err := New(stubClient{}, limits, append(opts, withRedis(redisstore.Options{OperatorRefresh: -1, Prefix: "down:"}))...)
			if err != nil {
				t.Fatal(err)
			}
			defer down.Close()
			ask := func(l *Limiter, id string) *httptest.ResponseRecorder {
				r, _ := http.NewRequest("GET", "/", nil)
				r.RemoteAddr = "192.0.2.1:1"
				if id != "" {
					r.Header.Set("X-Id", id)
				}
				w := httptest.NewRecorder()
				l.Handler(okHandler).ServeHTTP(w, r)
				return w
			}
			ask(lim, "a")
			for i, res := range []*httptest.ResponseRecorder{ask(lim, "a"), ask(down, "a"), ask(lim, "")} {
				code := []int{429, 503, 401}[i]
				def := []string{"Too Many Requests", "Service Unavailable", "Unauthorized"}[i]
				body := res.Body.String()
				if res.Code != code || want[i] == "" && !strings.Contains(body, def) || want[i] != "" && body != want[i] {
					t.Fatalf("answer %d: %d %q, want %d %q (%q by default)", i, res.Code, body, code, want[i], def)
				}
			}
		})
	})
}
