package ratelimit

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/operator"
)

// TestIDDigest generates identifiers of every length around operator.MaxKeyID and
// beyond (up to 1 MB, as a header can be), of safe and escaped bytes,
// denies them through the middleware by a Header limit and a Compose
// limit, and checks that what a Denial hook is told, once digested by
// IDDigest, addresses the client's counts: Inspector.Status of a digest reports the
// denial as LimitStatus of the identifier does, and ResetLimitDigest
// forgets that limit's counts for it and nothing else. Identifiers of at
// most operator.MaxKeyID bytes have no digest.
func TestIDDigest(t *testing.T) {
	t.Parallel() // waits on servers: runs beside the other parallel tests
	forBackends(t, testIDDigest)
}

func testIDDigest(t *testing.T, b backend) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	opts, _ := b.clock(t0)
	log := &denialLog{}
	lim := mustNew(t, b.newClient(t), []Limit{
		Per(time.Minute, 1, Header("X-A")).Named("a"),
		Per(time.Minute, 1, Compose(Header("X-B"), Header("X-A"))).Named("ab"),
	}, append(opts, WithObserver(observerOf(log)))...)
	h := lim.Handler(okHandler)
	ctx := context.Background()
	const alphabet = "abcXYZ019-._~ %{}#|\x01\xff"
	// Random bytes drawn once: a long identifier is a window of them at a
	// random offset, which is as random and far cheaper than drawing a
	// megabyte a byte at a time.
	pool := make([]byte, 2<<20)
	for i := range pool {
		pool[i] = alphabet[r.IntN(len(alphabet))]
	}
	gen := func() string {
		var n int
		switch r.IntN(4) {
		case 0:
			n = 1 + r.IntN(operator.MaxKeyID)
		case 1:
			n = operator.MaxKeyID - 4 + r.IntN(9)
		case 2:
			n = operator.MaxKeyID + 1 + r.IntN(4*operator.MaxKeyID)
		default:
			n = 1 << 20
		}
		at := r.IntN(len(pool) - n + 1)
		return strings.Map(func(c rune) rune { // a header value holds no control bytes
			if c < ' ' || c == 0x7f {
				return 'x'
			}
			return c
		}, string(pool[at:at+n]))
	}
	steps := 30
	if raceEnabled { // a megabyte a request is slow to read under the race detector
		steps = 10
	}
	for step := range steps { // fresh identifiers every step (distinct but with a tiny chance)
		a, bv := gen(), gen()
		if step%3 == 0 {
			bv = "b" // a Compose id just over operator.MaxKeyID
		}
		req := func() int {
			q := httptest.NewRequest("GET", "/", nil)
			q.Header.Set("X-A", a)
			q.Header.Set("X-B", bv)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, q)
			return w.Code
		}
		if c := req(); c != http.StatusOK {
			t.Fatalf("seed %d step %d: first request %d", seed, step, c)
		}
		if c := req(); c != http.StatusTooManyRequests {
			t.Fatalf("seed %d step %d: second request %d", seed, step, c)
		}
		got := log.take()
		if len(got) != 1 {
			t.Fatalf("seed %d step %d: observer told %d denials", seed, step, len(got))
		}
		limit, id, _ := strings.Cut(got[0], "\x00")
		digest := operator.IDDigest(id)
		if len(id) <= operator.MaxKeyID {
			if digest != "" {
				t.Fatalf("seed %d step %d: IDDigest of %d bytes = %q, want none", seed, step, len(id), digest)
			}
			continue
		}
		lr, err := lim.Inspect().Status(ctx, limit, digest)
		if err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		if !lr.Denied || lr.Remaining != 0 || lr.Name != limit {
			t.Fatalf("seed %d step %d: Inspector.Status of a digest(%s, %d bytes) = %+v, want denied", seed, step, limit, len(id), lr)
		}
		if err := lim.Inspect().Reset(ctx, limit, digest); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		if lr, err := lim.Inspect().Status(ctx, limit, digest); err != nil || lr.Denied || lr.Remaining != 1 {
			t.Fatalf("seed %d step %d: after ResetLimitDigest(%s): %+v, %v", seed, step, limit, lr, err)
		}
		if limit == "a" {
			if lr, err := lim.Inspect().Status(ctx, "a", escapeID(a)); err != nil || lr.Remaining != 1 {
				t.Fatalf("seed %d step %d: LimitStatus after ResetLimitDigest: %+v, %v", seed, step, lr, err)
			}
		}
	}
	if _, err := lim.Inspect().Status(ctx, "a", ""); err == nil {
		t.Error("Status of an empty id: no error")
	}
	if err := lim.Inspect().Reset(ctx, "a", ""); err == nil {
		t.Error("Reset of an empty id: no error")
	}
	// No identifier is read as a digest: one that begins with '#' is given
	// with one more '#' in front, and one that is not of a digest's form
	// may also be given as it is.
	shaped := operator.IDDigest(strings.Repeat("y", 200)) // an identifier of a digest's form
	n := 0
	for _, tc := range []struct{ id, asGiven string }{
		{"#", "#"}, {"#abc", "#abc"}, {"##x", ""}, {shaped, ""}, {"x" + shaped[1:], "x" + shaped[1:]}, {shaped + "=", shaped + "="},
	} {
		for _, given := range []string{escapeID(tc.id), tc.asGiven} {
			if given == "" {
				continue
			}
			if err := lim.Inspect().Reset(ctx, "a", given); err != nil {
				t.Fatalf("Reset(%q): %v", given, err)
			}
			if res, err := lim.Allow(ctx, []string{tc.id, "other" + strconv.Itoa(n)}, 1); err != nil || !res.Allowed {
				t.Fatalf("a request of %q: %+v, %v", tc.id, res, err)
			}
			n++
			if lr, err := lim.Inspect().Status(ctx, "a", given); err != nil || !lr.Denied {
				t.Errorf("Status(%q) after a request of %q: %+v, %v; want it denied", given, tc.id, lr, err)
			}
		}
	}
	if _, err := lim.Inspect().Status(ctx, "nope", operator.IDDigest(strings.Repeat("y", 200))); err == nil {
		t.Error("Inspector.Status of a digest of an unknown limit: no error")
	}
}

// escapeID returns id as Inspector.Status and Reset take an identifier:
// with one more '#' in front when it begins with '#'.
func escapeID(id string) string {
	if strings.HasPrefix(id, "#") {
		return "#" + id
	}
	return id
}
