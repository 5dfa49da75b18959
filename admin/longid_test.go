package admin_test

import (
	"context"
	"encoding/base64"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/admin"
	"github.com/slidinglog/ratelimit/internal/longtest"

	"github.com/slidinglog/ratelimit/operator"
)

// longID returns a random hostile identifier of a random length: short,
// around operator.MaxKeyID, around admin.MaxID, or 1 MB (the most a
// header value can be under net/http's defaults), its first bytes shared
// with others so that only its tail tells it apart.
func longID(r *rand.Rand, head string) string {
	var n int
	switch r.IntN(5) {
	case 0:
		n = 1 + r.IntN(operator.MaxKeyID)
	case 1:
		n = operator.MaxKeyID - 3 + r.IntN(7)
	case 2:
		n = admin.MaxID - 3 + r.IntN(7)
	case 3:
		n = operator.MaxKeyID + r.IntN(3*admin.MaxID)
	default:
		n = 1 << 20
	}
	var b strings.Builder
	b.WriteString(head[:min(len(head), n)])
	for b.Len() < n {
		b.WriteString(hostileID(r))
		if r.IntN(8) == 0 {
			b.WriteString("\xff") // not UTF-8
		}
	}
	return b.String()[:n]
}

// TestLongIdentifiers generates denials of identifiers of every length
// (up to 1 MB) that share long prefixes, and checks that every entry the
// index lists can be acted on as the page links and forms do: its state
// (by id, or by digest for one longer than operator.MaxKeyID) is the
// identifier's, denied, and its reset forgets exactly that identifier's
// counts.
func TestLongIdentifiers(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	f := newFixture(t, admin.Options{Capacity: 64, Top: 64})
	ctx := context.Background()
	head := strings.Repeat("Bearer eyJhbGciOi", 20)
	var ids []string
	seen := map[string]bool{}
	for range 4 + r.IntN(12) {
		id := longID(r, head)
		if seen[id] {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
		for range 4 {
			_, _ = f.lim.Allow(ctx, []string{id, "global"}, 1)
		}
	}
	var idx struct {
		Limits []struct {
			Name string
			Top  []struct {
				ID, ID64, Digest string
				Count            uint64
			}
		}
	}
	if code, body := f.get(t, "?format=json", &idx); code != http.StatusOK {
		t.Fatalf("seed %d: %d %s", seed, code, body)
	}
	top := idx.Limits[1].Top
	if len(top) != len(ids) {
		t.Fatalf("seed %d: %d listed, %d denied", seed, len(top), len(ids))
	}
	for _, e := range top {
		if len(e.ID) > operator.MaxKeyID+1 {
			t.Errorf("seed %d: an entry of %d bytes listed", seed, len(e.ID))
		}
		// The identifier this entry is: the one it names whole, or by
		// its first bytes and digest.
		var id string
		if e.ID64 != "" { // not UTF-8: JSON cannot carry it as it is
			b, err := base64.RawURLEncoding.DecodeString(e.ID64)
			if err != nil {
				t.Fatalf("seed %d: id64 %q: %v", seed, e.ID64, err)
			}
			e.ID = string(b)
		}
		for _, c := range ids {
			if e.Digest == "" && c == e.ID || e.Digest != "" && operator.IDDigest(c) == e.Digest {
				id = c
			}
		}
		if id == "" || e.Count != 1 {
			t.Fatalf("seed %d: entry %.40q (digest %q) x%d is no identifier denied once", seed, e.ID, e.Digest, e.Count)
		}
		q := url.Values{"limit": {"client"}, "id64": {base64.RawURLEncoding.EncodeToString([]byte(e.ID))}}
		form := url.Values{"limit": {"client"}, "id64": {base64.RawURLEncoding.EncodeToString([]byte(e.ID))}}
		if e.Digest != "" {
			q = url.Values{"limit": {"client"}, "digest": {e.Digest}}
			form = q
		}
		var st struct {
			Denied         bool
			DeniedRecently uint64 `json:"denied_recently"`
		}
		if code, body := f.get(t, "id?format=json&"+q.Encode(), &st); code != http.StatusOK || !st.Denied || st.DeniedRecently != 1 {
			t.Fatalf("seed %d: state of the %d-byte identifier: %d %+v %.300s", seed, len(id), code, st, body)
		}
		resp, err := http.PostForm(f.base+"reset?format=json", form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("seed %d: reset of the %d-byte identifier: %d", seed, len(id), resp.StatusCode)
		}
		for _, c := range ids {
			lr, err := f.lim.Inspect().Status(ctx, "client", c)
			if want := !seen[c] || c == id; err != nil || (lr.Remaining == 3) != want {
				t.Fatalf("seed %d: after the reset of the %d-byte identifier, the %d-byte one: %+v %v", seed, len(id), len(c), lr, err)
			}
		}
		seen[id] = false // reset
	}
}

// TestSketchBytes denies hostile identifiers of maximal length (1 MB),
// all distinct, in several limits over every minute of the window and
// beyond, and checks that the Handler holds no more than SketchBytes per
// limit, by the heap: it keeps no identifier whole.
func TestSketchBytes(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 0))
	now := t0
	o := admin.Options{Capacity: 1 + r.IntN(16), Minutes: 1 + r.IntN(4), Now: func() time.Time { return now }}
	buf := make([]byte, 2<<20)
	for i := range buf {
		buf[i] = byte(' ' + r.IntN(95))
	}
	big := string(buf)
	limits := []string{"a", "b", "c"}
	before := longtest.LiveHeap()
	adm := admin.New(o)
	deny := adm.Observer().Denial
	for i := range 2 * o.Capacity * (o.Minutes + 1) {
		now = t0.Add(time.Duration(i%(o.Minutes+1)) * time.Minute)
		deny(limits[i%len(limits)], big[i:i+1<<20])
	}
	after := longtest.LiveHeap()
	held := after - min(before, after)
	runtime.KeepAlive(big)
	runtime.KeepAlive(adm)
	// Beside the sketches, the Handler and its maps: a few KB.
	if bound := len(limits)*admin.SketchBytes(o) + 16<<10; held > uint64(bound) {
		t.Errorf("seed %d: %+v: the Handler holds %d bytes for %d limits, bound %d", seed, o, held, len(limits), bound)
	}
}
