package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/slidinglog/ratelimit/internal/logmodel"
	"github.com/slidinglog/ratelimit/internal/redislog"
)

// replicaModel holds every Redis call of a TestModelLeases run's replicas
// (on one server: a Cluster's split decisions roll back inside a
// decision) to internal/logmodel, the reference model with leases: each
// query the lease layer sends on to the Redis store (decisions, some of
// their limits answered from leases, and the leases' acquires), each
// rollback (a lease given back, a refund) and each forget (a reset) is
// applied to one model of every log, in the order Redis ran them (one
// call at a time), and the replies compared: admitted or not, each
// limit's count, the time the request or the lease was logged at, the
// units lent and removed.
type replicaModel struct {
	mu     sync.Mutex
	state  logmodel.State
	limits [repLimits]repLimit
	prefix string
	// lost holds the logs the model cannot follow: reset at the
	// server's clock (a request time of 0), which the test does not read.
	lost    map[logmodel.LogRef]bool
	calls   int
	diverge []string // the first divergences
	// slowBack delays every rollback before it is sent, as a loaded
	// machine may (see TestModelLeases).
	slowBack time.Duration
}

func newReplicaModel(prefix string, limits [repLimits]repLimit) *replicaModel {
	return &replicaModel{prefix: prefix, limits: limits, lost: map[logmodel.LogRef]bool{},
		state: logmodel.State{Limits: make([]logmodel.Limit, repLimits), Logs: map[logmodel.LogRef]*logmodel.Log{}}}
}

// watch makes every Redis call of l's leases, decisions, rollbacks and
// forgets go through m. It must run before l decides anything.
func (m *replicaModel) watch(l *Limiter) {
	lib := &replicaCheckLib{Library: l.redis.Lib, m: m}
	l.redis.Lib = lib
	l.redis.Rollbacks.Lib = lib
	l.leases.Next = &replicaCheckStore{next: l.leases.Next, m: m}
}

// ref returns the log of key, and whether the model follows it.
func (m *replicaModel) ref(key string) (logmodel.LogRef, bool) {
	rest, ok := strings.CutPrefix(key, m.prefix)
	open := strings.LastIndexByte(rest, '{')
	if !ok || open < 0 || !strings.HasSuffix(rest, "}") {
		return logmodel.LogRef{}, false
	}
	name, _, _ := strings.Cut(rest, ":")
	for i, n := range repNames {
		if n == name {
			r := logmodel.LogRef{Limit: i, ID: rest[open+1 : len(rest)-1]}
			return r, !m.lost[r]
		}
	}
	return logmodel.LogRef{}, false
}

// limit sets the model's limit i for a query's quota.
func (m *replicaModel) limit(i, quota int) logmodel.Limit {
	l := m.limits[i]
	m.state.Limits[i] = logmodel.Limit{Name: repNames[i], Quota: quota, Window: l.window, Unit: l.unit, Lease: l.lease}
	return m.state.Limits[i]
}

func (m *replicaModel) diverged(format string, args ...any) {
	if len(m.diverge) < 5 {
		m.diverge = append(m.diverge, fmt.Sprintf(format, args...)+fmt.Sprintf(" [call %d, %d logs, lost %v]", m.calls, len(m.state.Logs), m.lost))
	}
}

// decided applies a query the Redis store answered, and compares.
func (m *replicaModel) decided(q *redislog.Query, out *redislog.Outcome) {
	m.calls++
	type part struct {
		j   int
		ref logmodel.LogRef
		v   logmodel.Verdict
	}
	var parts []part
	lost := false
	for j, key := range q.Keys {
		quota := q.Quota(j)
		if quota <= 0 {
			continue
		}
		ref, ok := m.ref(key)
		if !ok {
			lost = true
			continue
		}
		m.limit(ref.Limit, quota)
		parts = append(parts, part{j: j, ref: ref})
	}
	if lost { // the other logs take what Redis logged, unchecked
		for _, p := range parts {
			if r := out.Replies[p.j]; out.Allowed && q.Acquire == 0 {
				m.state.Log(p.ref).Add(r.Next, q.Cost)
			}
		}
		return
	}
	if len(parts) == 0 {
		return
	}
	if q.Acquire > 0 {
		p := parts[0]
		lent := m.state.Acquire(p.ref, q.Cost, q.Acquire, q.Now)
		r := out.Replies[p.j]
		got := redislog.Granted(q, out)
		if out.Allowed != lent.Room || r.Count != int64(lent.Count) || got != lent.Granted || lent.Room && r.Next != lent.At {
			m.diverged("acquire of %d (cost %d) of %v at %d: Redis admitted %v, count %d, lent %d at %d; the model: %v, %d, %d at %d",
				q.Acquire, q.Cost, p.ref, q.Now, out.Allowed, r.Count, got, r.Next, lent.Room, lent.Count, lent.Granted, lent.At)
		}
		return
	}
	all := true
	for k := range parts {
		p := &parts[k]
		l := m.state.Limits[p.ref.Limit]
		p.v = l.Judge(m.state.Log(p.ref), q.Now, q.Cost)
		all = all && p.v.Room
	}
	if out.Allowed != all {
		m.diverged("decision of cost %d at %d: Redis admitted %v, the model %v (%+v)", q.Cost, q.Now, out.Allowed, all, parts)
	}
	for _, p := range parts {
		r := out.Replies[p.j]
		if r.Count != int64(p.v.Count) {
			m.diverged("decision of cost %d of %v at %d: Redis counted %d, the model %d (at %d)", q.Cost, p.ref, q.Now, r.Count, p.v.Count, p.v.View)
		}
		if out.Allowed && all {
			m.state.Log(p.ref).Add(p.v.At, q.Cost)
			if r.Next != p.v.At {
				m.diverged("decision of cost %d of %v at %d: Redis logged it at %d, the model at %d", q.Cost, p.ref, q.Now, r.Next, p.v.At)
			}
		}
	}
}

// replicaCheckStore is the Redis store the lease layer calls, one call at
// a time, each applied to the model.
type replicaCheckStore struct {
	next redislog.Store
	m    *replicaModel
}

func (s *replicaCheckStore) Decide(ctx context.Context, q *redislog.Query, out *redislog.Outcome) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	err := s.next.Decide(ctx, q, out)
	if err == nil && !q.Peek && q.Now != 0 {
		s.m.decided(q, out)
	}
	return err
}

// replicaCheckLib is the Lua library's runner, whose rollbacks and
// forgets are applied to the model, one call at a time.
type replicaCheckLib struct {
	redislog.Library
	m *replicaModel
}

// uintAt decodes the big-endian number in b.
func uintAt(b []byte) (n int64) {
	for _, c := range b {
		n = n<<8 | int64(c)
	}
	return n
}

func (l *replicaCheckLib) Rollback(ctx context.Context, keys []string, req, stamps []byte) (int64, error) {
	m := l.m
	time.Sleep(m.slowBack) // outside m.mu: the other calls go on meanwhile
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := l.Library.Rollback(ctx, keys, req, stamps)
	if err != nil || len(req) < 11 || len(stamps) != 7*len(keys) {
		return n, err
	}
	m.calls++
	cost := int(uintAt(req[7:11]))
	removed, pruned := int64(0), false
	var per []string
	for i, key := range keys {
		ref, ok := m.ref(key)
		at := uintAt(stamps[7*i : 7*i+7])
		if !ok {
			pruned = true // not followed: Redis's total cannot be compared
			continue
		}
		if at > 0 {
			if g := m.state.Logs[ref]; g != nil {
				// An entry no later decision counts may be gone from Redis
				// (the prune rule); the model keeps every entry.
				l := m.state.Limits[ref.Limit]
				l.Lease = m.limits[ref.Limit].lease
				pruned = pruned || at <= g.Time-l.Ahead()-l.Window
				k := g.Remove(at, cost)
				removed += int64(k)
				per = append(per, fmt.Sprintf("%v at %d: %d (log %+v, time %d)", ref, at, k, g.Runs, g.Time))
			}
		}
	}
	if removed != n && !pruned {
		m.diverged("rollback of %d at %x of %v: Redis removed %d, the model %d: %v", cost, stamps, keys, n, removed, per)
	}
	return n, err
}

func (l *replicaCheckLib) Forget(ctx context.Context, keys []string, req []byte) (int64, error) {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := l.Library.Forget(ctx, keys, req)
	if err != nil || len(req) < 7 {
		return n, err
	}
	m.calls++
	now := uintAt(req[:7])
	for _, key := range keys {
		ref, ok := m.ref(key)
		if !ok {
			continue
		}
		if now == 0 && m.limits[ref.Limit].lease > 0 {
			m.lost[ref] = true // at the server's clock: the model cannot follow
			continue
		}
		m.limit(ref.Limit, m.state.Limits[ref.Limit].Quota)
		m.state.Forget(ref, now)
	}
	return n, err
}
