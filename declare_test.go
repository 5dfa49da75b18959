package ratelimit

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/operator"
	"github.com/slidinglog/ratelimit/redisstore"
)

// warnLog collects the limits WarningDefinitionConflict names in a
// Limiter's log.
type warnLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *warnLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// conflicts returns the names of the conflict warnings logged, each as
// many times as logged.
func (w *warnLog) conflicts() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, line := range strings.Split(w.buf.String(), "\n") {
		if !strings.Contains(line, "warning="+string(WarningDefinitionConflict)) {
			continue
		}
		_, rest, _ := strings.Cut(line, " limit=")
		name, _, _ := strings.Cut(rest, " ")
		out[name]++
	}
	return out
}

// countWarnings is an observer (its Warning hook) that counts the warnings it is told of.
type countWarnings struct {
	mu sync.Mutex
	n  map[Warning]int
}

func (c *countWarnings) Observe(Result, error, time.Duration) {}
func (c *countWarnings) ObserveWarning(w Warning) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[Warning]int{}
	}
	c.n[w]++
}

// TestDefinitionConflicts draws sets of replicas (Limiters with their own
// clients, one prefix) of random definitions of a few names (kind of key,
// window, precision, quota, some unnamed), some of them stopped long ago
// (their declarations written with an expired stamp), starts the live
// ones one after another, and after one more refresh of each checks that
// a live replica warned, once, of exactly its names that another live
// replica declares with another definition (see definition.same), and
// that its observer was told as often.
func TestDefinitionConflicts(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		seed := rand.Uint64()
		t.Logf("seed %d", seed)
		r := rand.New(rand.NewPCG(seed, 0))
		ctx := context.Background()
		for round := range 6 {
			prefix := fmt.Sprintf("dc%d:", round)
			type replica struct {
				limits []Limit
				log    *warnLog
				obs    *countWarnings
				l      *driven
			}
			drawLimit := func() Limit {
				keys := []Key{ClientIP(), Header("X-K")}
				lim := Per([]time.Duration{time.Minute, 2 * time.Minute}[r.IntN(2)], []int{5, 10}[r.IntN(2)], keys[r.IntN(2)])
				if r.IntN(3) == 0 {
					lim = lim.Bucketed(10 * time.Second)
				}
				if r.IntN(4) != 0 {
					lim = lim.Named([]string{"a", "b"}[r.IntN(2)])
				}
				return lim
			}
			var live []*replica
			stopped := 0
			n := 2 + r.IntN(3)
			for range n {
				rep := &replica{log: &warnLog{}, obs: &countWarnings{}}
				names := map[string]bool{}
				for range 1 + r.IntN(2) {
					lim := drawLimit()
					name := lim.Name
					if name == "" {
						name = lim.defaultName()
					}
					if !names[name] {
						names[name] = true
						rep.limits = append(rep.limits, lim)
					}
				}
				if r.IntN(4) == 0 { // a replica that stopped long ago
					stopped++
					writeStale(t, b, prefix, rep.limits)
					continue
				}
				live = append(live, rep)
			}
			for _, rep := range live {
				rep.l = newDriven(t, b.newClient(t), rep.limits, withRedis(redisstore.Options{Prefix: prefix}),
					WithLogger(slog.New(slog.NewTextHandler(rep.log, nil)), false), WithObserver(observerOf(rep.obs)))
			}
			for _, rep := range live {
				if err := rep.l.tick(); err != nil {
					t.Fatal(err)
				}
			}
			for i, rep := range live {
				want := map[string]int{}
				mineDefs := rep.l.limitNames()
				for j, other := range live {
					if i == j {
						continue
					}
					for name, od := range other.l.limitNames() {
						if md, ok := mineDefs[name]; ok && !md.same(od) {
							want[name] = 1
						}
					}
				}
				got := rep.log.conflicts()
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("seed %d round %d: replica %d of %d live (%d stopped), limits %v: warned %v, want %v\n%s", seed, round, i, len(live), stopped, mineDefs, got, want, rep.log.buf.String())
				}
				total := 0
				for _, c := range want {
					total += c
				}
				rep.obs.mu.Lock()
				if rep.obs.n[WarningDefinitionConflict] != total {
					t.Errorf("seed %d round %d: replica %d: observer told %d conflicts, want %d", seed, round, i, rep.obs.n[WarningDefinitionConflict], total)
				}
				rep.obs.mu.Unlock()
			}
			if len(live) == 0 {
				continue
			}
			st, err := live[0].l.Inspect().Operator().List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range st.Declared {
				if d.Expires.Before(time.Now()) {
					t.Errorf("seed %d: a stale declaration listed: %+v", seed, d)
				}
			}
		}
	})
}

// writeStale writes the declarations of limits into the operator hash of
// prefix as a replica that stopped an hour ago left them.
func writeStale(t *testing.T, b backend, prefix string, limits []Limit) {
	t.Helper()
	c := b.newClient(t)
	past := time.Now().Add(-time.Hour).UnixMicro()
	for i, lim := range limits {
		if lim.Name == "" {
			lim.Name, lim.defaulted = lim.defaultName(), true
		}
		d := definitionOf(&lim).declaration(lim.Name, nil)
		u := "n"
		if d.Unnamed {
			u = "u"
		}
		v := fmt.Sprintf("%d %d %d %d %d %s %s", past, past+30e6, d.Quota, d.Window.Microseconds(), d.Precision.Microseconds(), u, d.Kind)
		if err := c.HSet(context.Background(), operator.Key(prefix), "d/"+lim.Name+"/stale"+strconv.Itoa(i)+"xxxxxxxxxx", v).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
