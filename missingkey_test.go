package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/redisstore"
)

// TestMissingKey: a request a Key cannot identify is its own outcome, under
// every failure mode: 401 with no rate-limit headers and no Retry-After,
// counted in no limit, no Redis failure for the circuit breaker (many of
// them in a row leave it closed), observed with the limit that had no key
// marked NoKey and an error that wraps ErrNoKey, and said once at Warn
// under the default; never the failure mode (503 under FailClosed and
// FailLocal, served uncounted under FailOpen).
func TestMissingKey(t *testing.T) { forBackends(t, testMissingKey) }

func testMissingKey(t *testing.T, b backend) {
	c := b.newClient(t)
	for _, mode := range []FailureMode{FailClosed, FailOpen, FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			var obs recordingObserver
			var hooked []error
			logger, logs := newLogger()
			lim := mustNew(t, c, []Limit{Per(time.Minute, 100, ClientIP()).Named("ip-" + mode.String()), Per(time.Minute, 2, User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(ctxKey{}).(string); return u, ok })).Named("user-" + mode.String())},
				WithFailureMode(mode), WithObserver(observerOf(&obs)), WithLogger(logger, false), withRedis(redisstore.Options{BreakerFailures: 2, BreakerCoolDown: 1 << 40}),
				WithHandlers(Handlers{Error: func(_ *http.Request, err error) { hooked = append(hooked, err) }}))
			h := lim.Handler(okHandler)
			for i := range 5 {
				w := serve(h, "GET", "/", "192.0.2.1:1") // no user
				if w.Code != 401 || w.Body.String() != "Unauthorized\n" || w.Header().Get("Retry-After") != "" || w.Header().Get("X-RateLimit-Limit") != "" {
					t.Fatalf("no user %d: %d %v %q; want 401 Unauthorized, no Retry-After, no limit headers", i, w.Code, w.Header(), w.Body)
				}
			}
			if lim.Inspect().Stats().BreakerOpen {
				t.Error("the circuit breaker opened on requests without a key")
			}
			if len(hooked) != 5 || !errors.Is(hooked[0], ErrNoKey) {
				t.Errorf("the error handler saw %v, want 5 errors wrapping ErrNoKey", hooked)
			}
			if len(obs.seen) != 5 {
				t.Fatalf("observed %d decisions, want 5", len(obs.seen))
			}
			if o := obs.seen[0]; o.allowed || o.local || !errors.Is(o.err, ErrNoKey) || len(o.limits) != 2 ||
				o.limits[0].NoKey || !o.limits[0].Skipped || !o.limits[1].NoKey || !o.limits[1].Skipped {
				t.Errorf("observed %+v; want not allowed, ErrNoKey, both limits skipped, the user limit NoKey", o)
			}
			if n := strings.Count(logs.String(), "refused with 401"); n != 1 || strings.Contains(logs.String(), "failure mode applied") {
				t.Errorf("the log says the default %d times (want once) and no failure:\n%s", n, logs)
			}
			// Nothing was counted; a request with a user still is.
			if n := logEntries(t, c, "ip-"+mode.String(), "ip", "192.0.2.1"); n != 0 {
				t.Errorf("the per-IP log holds %d entries, want 0", n)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "192.0.2.1:1"
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, "ann")))
			if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "2" {
				t.Errorf("with a user: %d %v, want 200 limit 2", w.Code, w.Header())
			}
		})
	}
}

// TestMissingKeyChoices: WithHandlers(Handlers{ServeMissingKey: true}) lets a request with
// no key through this Limiter uncounted and without its headers, observed
// Allowed with NoKey; Handlers.MissingKey answers instead of 401; either
// silences the default's warning. A Key error that does not wrap ErrNoKey
// is a failure still (503). New refuses a nil handler and an unknown
// choice.
func TestMissingKeyChoices(t *testing.T) { forBackends(t, testMissingKeyChoices) }

func testMissingKeyChoices(t *testing.T, b backend) {
	c := b.newClient(t)
	var obs recordingObserver
	logger, logs := newLogger()
	skip := mustNew(t, c, []Limit{Per(time.Minute, 2, User(func(r *http.Request) (string, bool) { u, ok := r.Context().Value(ctxKey{}).(string); return u, ok })).Named("skip")}, WithHandlers(Handlers{ServeMissingKey: true}),
		WithObserver(observerOf(&obs)), WithLogger(logger, false))
	if w := serve(skip.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "" {
		t.Errorf("skip: %d %v, want 200 without limit headers", w.Code, w.Header())
	}
	if len(obs.seen) != 1 || !obs.seen[0].allowed || !obs.seen[0].limits[0].NoKey || !errors.Is(obs.seen[0].err, ErrNoKey) {
		t.Errorf("skip: observed %+v, want allowed with NoKey and ErrNoKey", obs.seen)
	}
	var got error
	own := mustNew(t, c, []Limit{Per(time.Minute, 2, Header("X-Api-Key")).Named("own")}, WithLogger(logger, false),
		WithHandlers(Handlers{MissingKey: func(w http.ResponseWriter, _ *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusForbidden)
		}}))
	if w := serve(own.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 403 || !errors.Is(got, ErrNoKey) || !strings.Contains(got.Error(), "X-Api-Key") {
		t.Errorf("handler: %d, handler saw %v; want 403 and ErrNoKey naming the header", w.Code, got)
	}
	if strings.Contains(logs.String(), "refused with 401") {
		t.Errorf("warned although the answer was chosen:\n%s", logs)
	}
	broken := mustNew(t, c, []Limit{Per(time.Minute, 2, KeyFunc("session", func(*http.Request) (string, error) {
		return "", errors.New("session store down")
	})).Named("session")})
	if w := serve(broken.Handler(okHandler), "GET", "/", "192.0.2.1:1"); w.Code != 503 {
		t.Errorf("a failing key: %d, want the failure mode's 503", w.Code)
	}
}
