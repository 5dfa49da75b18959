package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
	"github.com/slidinglog/ratelimit/store"
)

// callTimeout bounds a call of the store's own methods whose context has
// no earlier deadline.
const callTimeout = time.Second

// maxSpecs bounds the compiled limits the store's own methods keep.
const maxSpecs = 4096

// mechanism returns what s's own methods decide with, made once: the Lua
// library, the breakers and the rollbacks, apart from any Limiter's.
func (s *Store) mechanism() *redislog.Redis {
	s.once.Do(func() {
		lib := slidinglog.New(slidinglog.Default, s.client, Sharded(s.client))
		failures := max(s.opts.BreakerFailures, 0)
		s.redis = &redislog.Redis{Lib: lib, Breakers: &redislog.Breakers{Failures: int32(failures), CoolDown: s.opts.BreakerCoolDown},
			Rollbacks: redislog.NewRollbacks(lib, callTimeout, func(error) {})}
		s.specs = map[string]*redislog.Spec{}
	})
	return s.redis
}

// spec returns the compiled form of limits.
func (s *Store) spec(limits []store.Limit) (*redislog.Spec, error) {
	s.mechanism()
	key := fmt.Sprintf("%#v", limits)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.specs[key]; p != nil {
		return p, nil
	}
	p, _, err := redislog.NewSpec(limits, nil, Sharded(s.client))
	if err != nil {
		return nil, err
	}
	if len(s.specs) >= maxSpecs {
		clear(s.specs)
	}
	s.specs[key] = p
	return p, nil
}

// hashTag returns the part of key Redis Cluster hashes: the text between
// the first '{' and the next '}', if not empty, else the whole key.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						return key[i+1 : j]
					}
					return key
				}
			}
			return key
		}
	}
	return key
}

// groups returns the groups of q's limits that one call may decide: all
// of them, or on a sharded client those whose keys share a hash tag.
func groups(p *redislog.Spec, keys []string) ([][]int, []string) {
	if !p.Split {
		return p.Whole, nil
	}
	tags := make([]string, len(keys))
	for i, key := range keys {
		tags[i] = hashTag(key)
	}
	return p.Groups(tags), tags
}

// Decide decides q in Redis ([store.Store]): in one Lua call, or on a
// Redis Cluster or Ring one per hash tag of q's keys, a later group that
// denies taking back what earlier ones logged. It waits for Redis until
// ctx's deadline, or a second if that is earlier; an error wraps
// [ErrNoScripting] or [ErrUnexpectedReply] where those apply, and
// [ErrCircuitOpen] while the store's own breaker (Options.BreakerFailures)
// is open. A Limiter on s decides through its own mechanism, with its
// deny cache and leases, not through Decide.
func (s *Store) Decide(ctx context.Context, q *store.Query, out *store.Outcome) error {
	p, err := s.spec(q.Limits)
	if err != nil {
		return err
	}
	start := time.Now()
	iq := &redislog.Query{Query: *q, Spec: p, Wall: start, Local: start, Timeout: callTimeout,
		Deadline: redislog.Deadline(ctx, start, callTimeout)}
	if q.Now != 0 {
		iq.Local = time.UnixMicro(q.Now)
	}
	_, iq.Tags = groups(p, q.Keys)
	iout := redislog.Outcome{Outcome: *out}
	err = s.mechanism().Decide(ctx, iq, &iout)
	*out = iout.Outcome
	return err
}

// settled returns what Credit and Debit need of q.
func (s *Store) settled(ctx context.Context, q *store.Query, stamps []int64) (*redislog.Spec, [][]int, time.Time, error) {
	if len(stamps) != len(q.Keys) || len(q.Limits) != len(q.Keys) {
		return nil, nil, time.Time{}, fmt.Errorf("redisstore: %d stamps and %d limits for %d keys", len(stamps), len(q.Limits), len(q.Keys))
	}
	p, err := s.spec(q.Limits)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	g, _ := groups(p, q.Keys)
	return p, g, redislog.Deadline(ctx, time.Now(), callTimeout), nil
}

// Credit takes back q.Cost units of a request at its stamps
// ([store.Settler]), one Lua call per hash tag. What Redis has not
// confirmed by ctx's deadline (or a second) goes on in the background;
// the error then says so, as it says how many units Redis refused to take
// back.
func (s *Store) Credit(ctx context.Context, q *store.Query, stamps []int64) error {
	p, g, deadline, err := s.settled(ctx, q, stamps)
	if err != nil {
		return err
	}
	res := redislog.ReservationsAt(p, q.Keys, g, q.Cost, q.Now, func(i int) int64 { return stamps[i] })
	switch u, pending := s.mechanism().Rollbacks.Credit(res, q.Cost, deadline); {
	case u > 0:
		return fmt.Errorf("redisstore: %d units were not taken back; they stay counted until they leave their windows", u)
	case pending:
		return errors.New("redisstore: the credit was still under way at the deadline; it goes on in the background")
	}
	return nil
}

// Debit logs q.Cost more units of a request at its stamps, each up to
// its quota ([store.Settler]), one Lua call per hash tag: everywhere or,
// if a call fails for good, nowhere. It waits as Credit does.
func (s *Store) Debit(ctx context.Context, q *store.Query, stamps []int64) error {
	p, g, deadline, err := s.settled(ctx, q, stamps)
	if err != nil {
		return err
	}
	charges := redislog.Charges(p, q.Keys, g, q.Cost, q.Now, q.Quotas, func(i int) int64 { return stamps[i] })
	switch u, pending := s.mechanism().Rollbacks.Charge(charges, deadline); {
	case u > 0:
		return fmt.Errorf("redisstore: a debit of %d was not logged (%d units)", q.Cost, u)
	case pending:
		return errors.New("redisstore: the debit was still under way at the deadline; it goes on in the background")
	}
	return nil
}

// Forget drops the log of each of q's limits, and its block
// ([store.Forgetter]), one call per limit, at q.Now (0: the server's
// clock). It waits for Redis until ctx's deadline, or a second.
func (s *Store) Forget(ctx context.Context, q *store.Query) error {
	p, err := s.spec(q.Limits)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	lib := s.mechanism().Lib
	var errs []error
	for i, key := range q.Keys {
		req := slidinglog.AppendRequest(nil, max(q.Now, 0), 1, p.Limits[i].Lua)
		if _, err := lib.Forget(ctx, p.LuaKeys([]string{key}, []int{i}), req); err != nil {
			errs = append(errs, fmt.Errorf("redisstore: forgetting %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

// inflightSpec is the Lua code's description of an in-flight log, which a
// release reads only its kind of.
var inflightSpec = sync.OnceValue(func() slidinglog.Specs {
	spec, err := slidinglog.Encode(slidinglog.Limit{Kind: slidinglog.InFlight, Quota: 1, Window: time.Second})
	if err != nil {
		panic(err) // a constant limit: tested
	}
	return spec
})

// Release frees holder's slot in each in-flight log of ids
// ([store.Holder]), one call per log. It waits for Redis until ctx's
// deadline, or a second.
func (s *Store) Release(ctx context.Context, ids []store.LogID, holder uint64) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	lib := s.mechanism().Lib
	req := slidinglog.AppendRequest(nil, 0, 1, inflightSpec())
	stamps := slidinglog.AppendStamps(nil, []int64{int64(holder)})
	var errs []error
	for _, id := range ids {
		if _, err := lib.Rollback(ctx, []string{id.Key}, req, stamps); err != nil {
			errs = append(errs, fmt.Errorf("redisstore: releasing a slot in %s: %w", id.Key, err))
		}
	}
	return errors.Join(errs...)
}

// Renew extends the slots of holders[i] in the in-flight log ids[i] to
// lease from now (0: the server's clock) ([store.Holder]), one call per
// log, and returns how many it found held. It waits for Redis until ctx's
// deadline, or a second.
func (s *Store) Renew(ctx context.Context, now int64, ids []store.LogID, lease time.Duration, holders [][]uint64) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	lib := s.mechanism().Lib.(*slidinglog.Redis)
	total := 0
	var errs []error
	for i, id := range ids {
		var n int64
		var err error
		if now != 0 {
			n, err = lib.RenewAt(ctx, now, []string{id.Key}, lease, holders[i:i+1])
		} else {
			n, err = lib.Renew(ctx, []string{id.Key}, lease, holders[i:i+1])
		}
		total += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("redisstore: renewing slots in %s: %w", id.Key, err))
		}
	}
	return total, errors.Join(errs...)
}
