package route

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// checkSeed returns the seed of a generated test: RATELIMIT_SEED, else
// the time.
func checkSeed(t *testing.T) uint64 {
	if s := os.Getenv("RATELIMIT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// genRoute is a generated route: its method ("" for every method) and
// its segments, each a literal or a parameter named after its position.
type genRoute struct {
	method string
	segs   []string // "x" literal, "{p1}" parameter
	tail   bool     // a trailing wildcard
}

// canonical writes r in the canonical form.
func (r genRoute) canonical() string { return r.spell(0) }

// spell writes r in one router's syntax: 0 ServeMux, 1 gin/echo, 2 chi
// with a regular expression.
func (r genRoute) spell(syntax int) string {
	var b strings.Builder
	if r.method != "" {
		b.WriteString(r.method + " ")
	}
	for _, s := range r.segs {
		b.WriteByte('/')
		if name, ok := strings.CutPrefix(s, "{"); ok {
			name = strings.TrimSuffix(name, "}")
			switch syntax {
			case 1:
				s = ":" + name
			case 2:
				s = "{" + name + ":[0-9]+}"
			}
		}
		b.WriteString(s)
	}
	if r.tail {
		b.WriteString([]string{"/{rest...}", "/*rest", "/*"}[syntax])
	}
	return b.String()
}

func genRoutes(rng *rand.Rand, n int) []genRoute {
	methods := []string{"", http.MethodGet, http.MethodPost, http.MethodDelete}
	words := []string{"users", "login", "files", "a", "b", "orders"}
	var out []genRoute
	for range n {
		r := genRoute{method: methods[rng.IntN(len(methods))], tail: rng.IntN(5) == 0}
		for i := range 1 + rng.IntN(3) {
			if rng.IntN(3) == 0 {
				r.segs = append(r.segs, "{p"+strconv.Itoa(i)+"}")
			} else {
				r.segs = append(r.segs, words[rng.IntN(len(words))])
			}
		}
		out = append(out, r)
	}
	return out
}

// TestCheckClass: for generated routers (routes of random methods,
// literals, parameters and wildcards) and tables (the routes written in
// another router's syntax, and routes of another generated router),
// Check reports exactly the entries whose method and canonical path no
// served route has (either side's missing method matching any), each
// once, quoted, wrapping ErrUnmatched; and CheckMux of a ServeMux that
// serves the same routes accepts every entry that names one of them.
func TestCheckClass(t *testing.T) {
	seed := checkSeed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	for trial := range 300 {
		served := genRoutes(rng, 1+rng.IntN(6))
		var servedT []string
		for _, r := range served {
			servedT = append(servedT, r.spell(rng.IntN(3)))
		}
		var table []string
		want := map[string]bool{} // entry -> reported
		seen := map[string]bool{}
		add := func(entry string, reported bool) {
			if !seen[entry] {
				seen[entry] = true
				table = append(table, entry)
				want[entry] = reported
			}
		}
		for _, r := range served {
			if rng.IntN(2) == 0 {
				add(r.spell(rng.IntN(3)), false)
			}
		}
		for _, r := range genRoutes(rng, rng.IntN(4)) {
			reported := true
			for _, s := range served {
				if s.canonical() == r.canonical() || strings.TrimPrefix(s.canonical(), s.method+" ") == strings.TrimPrefix(r.canonical(), r.method+" ") && (s.method == "" || r.method == "") {
					reported = false
				}
			}
			add(r.spell(rng.IntN(3)), reported)
		}
		add(Unmatched, false)
		err := Check(table, servedT)
		for _, e := range table {
			got := err != nil && strings.Contains(err.Error(), "route "+strconv.Quote(e)+" matches no route")
			if got != want[e] {
				t.Fatalf("seed %d (RATELIMIT_SEED), trial %d: served %q, entry %q: reported %v, want %v (error %v)", seed, trial, servedT, e, got, want[e], err)
			}
		}
		if err != nil && !errors.Is(err, ErrUnmatched) {
			t.Fatalf("seed %d, trial %d: %v does not wrap ErrUnmatched", seed, trial, err)
		}

		// The same routes in a ServeMux: the entries that name a
		// served route are accepted.
		mux := http.NewServeMux()
		registered := map[string]bool{}
		var ok []string
		for _, r := range served {
			pattern := r.spell(0)
			if registered[pattern] || !register(mux, pattern) {
				continue
			}
			registered[pattern] = true
			ok = append(ok, r.spell(rng.IntN(3)))
		}
		if err := CheckMux(ok, mux); err != nil {
			t.Fatalf("seed %d (RATELIMIT_SEED), trial %d: mux of %q: CheckMux(%q) = %v; want nil", seed, trial, servedT, ok, err)
		}
	}
	if err := CheckMux(nil, nil); err == nil {
		t.Error("CheckMux of a nil mux: nil error")
	}
}

// register registers pattern in mux, and reports whether it could: a
// pattern that conflicts with one registered is left out.
func register(mux *http.ServeMux, pattern string) (ok bool) {
	defer func() { ok = recover() == nil }()
	mux.Handle(pattern, http.NotFoundHandler())
	return true
}
