package ratelimit

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit/redisstore"
)

// lateCallHook runs delay once, before the first call of the library's
// code whose keys are exactly key after a lease's acquire: the call of a
// request's other limits, sent after it took a unit from the lease (the
// call leaves the leased limit's key out).
type lateCallHook struct {
	key   string
	armed atomic.Bool // an acquire was sent
	fired atomic.Bool
	delay func()
}

func (h *lateCallHook) hit(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 4 || operatorCall(cmd) {
		return
	}
	name, _ := args[0].(string)
	if !strings.EqualFold(name, "fcall") && !strings.EqualFold(name, "evalsha") && !strings.EqualFold(name, "eval") {
		return
	}
	n, ok := args[2].(int)
	if !ok || n != 1 || len(args) < 5 {
		return
	}
	// A request's flags are its byte 13 (lua/codec.lua); FLAG_ACQUIRE is 8.
	var req string
	switch a := args[4].(type) {
	case []byte:
		req = string(a)
	case string:
		req = a
	}
	if len(req) > 13 && req[13]&8 != 0 {
		h.armed.Store(true)
		return
	}
	if args[3] == h.key && h.armed.Load() && h.fired.CompareAndSwap(false, true) {
		h.delay()
	}
}

func (h *lateCallHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateCallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hit(cmd)
		return next(ctx, cmd)
	}
}
func (h *lateCallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.hit(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestLeaseOtherLimitsDecidedLate: a request takes a unit of a leased
// Global limit from a lease, and its per-client limit is decided in Redis
// after the lease's end T (the call held back: a stalled shard, a slow
// network). Counted from the caller's side, by the times the Results
// report, no window holds more than the quota: the request is not
// admitted at its Redis time with a unit stamped T, which leaves the
// window before a window from its admission ends. On miniredis the Redis
// clock is set forward while the call is held back; on a real server and
// a Cluster (where the other limits' keys are on another primary) the call
// waits that long.
//
//	go test -run TestLeaseOtherLimitsDecidedLate -count=1 .
func TestLeaseOtherLimitsDecidedLate(t *testing.T) {
	forLeaseBackends(t, testLeaseOtherLimitsDecidedLate)
}

func testLeaseOtherLimitsDecidedLate(t *testing.T, b backend) {
	const window, quota = 2 * time.Second, 64
	const lease = window / 16 // Leased()'s
	const late = window / 4   // how long after T the other limits are decided
	limits := []Limit{Per(window, quota, Global()).Named("hot").Leased(), Per(window, 10*quota, Header("X-Client")).Named("ip")}
	// The Redis clock: miniredis's, set by the test; a real server's, the
	// wall clock, waited for.
	var redisNow func() time.Time
	var setRedis func(time.Time)
	if b.mr != nil {
		start := time.UnixMicro(1_800_000_000_000_000)
		b.mr.SetTime(start)
		clock := start
		redisNow = func() time.Time { return clock }
		setRedis = func(at time.Time) { clock = at; b.mr.SetTime(at) }
	} else {
		redisNow = time.Now
		setRedis = func(at time.Time) { time.Sleep(time.Until(at)) }
	}
	var held time.Time // the Redis time when the call was held back: T is at most lease and a unit later
	hook := &lateCallHook{key: logKey("ip", "header.X-Client", "c"), delay: func() {
		held = redisNow()
		setRedis(held.Add(lease + late))
	}}
	c := b.newClient(t)
	c.AddHook(hook)
	noDenyCache := withRedis(redisstore.Options{DenyCache: -1})
	l := mustNew(t, c, limits, noDenyCache)
	t.Cleanup(func() { _ = l.Close() })

	var admitted []admission
	allow := func(l *Limiter) bool {
		res, err := l.Allow(context.Background(), []string{globalID, "c"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted = append(admitted, admission{res.Now, 1})
		}
		return res.Allowed
	}
	// Requests until one takes a unit from a lease, and its call of the
	// per-client limit is held back past the lease's end.
	for i := 0; !hook.fired.Load(); i++ {
		if i == quota/2 {
			t.Fatalf("%d requests and none from a lease (%d leased)", i, l.Inspect().Stats().Leased)
		}
		allow(l)
	}
	lateAt := admitted[len(admitted)-1].at
	if lateAt.Before(held.Add(lease + late)) {
		t.Fatalf("the request held back was reported admitted at %v, before its call was decided (%v)", lateAt, held.Add(lease+late))
	}
	// The per-client limit counts each request admitted once: what the
	// late call logged was taken back, or else stayed the request's.
	st, err := l.Status(context.Background(), []string{globalID, "c"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := 10*quota - st.Limits[1].Remaining; used != len(admitted) {
		t.Fatalf("the per-client limit counts %d units: %d admitted", used, len(admitted))
	}
	// Other processes fill the Global limit once the lease's units have
	// left the window, within a window of the late admission: one until
	// it is denied, which gives back at Close what its leases hold, then
	// one that fills the rest with too few requests to take a lease.
	setRedis(held.Add(lease + window + 5*time.Millisecond))
	inWindow := 0
	fill := func(l *Limiter) {
		for range 2 * quota {
			if !allow(l) {
				return
			}
			if at := admitted[len(admitted)-1].at; at.Before(lateAt.Add(window)) {
				inWindow++
			}
		}
	}
	for range 2 {
		other := mustNew(t, b.newClient(t), limits, noDenyCache)
		t.Cleanup(func() { _ = other.Close() })
		fill(other)
		_ = other.Close()
	}
	if inWindow < quota-1 {
		t.Fatalf("only %d admitted within a window of the late admission: the machine was too slow to test it", inWindow)
	}
	if from, units, over := overQuota(admitted, window, quota); over {
		t.Fatalf("%d units admitted in the window from %v: quota %d (the late request reported at %v, %v after it was held back)",
			units, from, quota, lateAt, lateAt.Sub(held))
	}
}
