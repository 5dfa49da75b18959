package adapters_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/redistest"
)

// heldCall is a go-redis hook that holds the next call of the library's
// code naming key, once armed (arm), until open is closed; ran is told
// when it is over. Calls naming other keys (the operator state's refresh,
// the declarations) pass, so that no background call takes the hold.
type heldCall struct {
	mu   sync.Mutex
	key  string // armed for a call naming key; "" when not armed
	open chan struct{}
	ran  chan struct{}
}

// arm holds the next call that names key until open is closed.
func (h *heldCall) arm(key string, open chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.key, h.open = key, open
}

func (h *heldCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "fcall", "evalsha", "eval":
			h.mu.Lock()
			var open chan struct{}
			if h.key != "" && slices.Contains(cmd.Args(), any(h.key)) {
				open, h.key = h.open, ""
			}
			h.mu.Unlock()
			if open != nil {
				defer func() { h.ran <- struct{}{} }()
				<-open
			}
		}
		return next(ctx, cmd)
	}
}

func (h *heldCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSettlePendingRouters: a handler's ratelimit.Settle that Redis has
// not confirmed by its context's deadline returns an error that wraps
// ErrSettlePending (not nil, not ErrNotReverted), through net/http and
// every router, on miniredis and a real server; the background then
// applies it: the log holds the real cost.
func TestSettlePendingRouters(t *testing.T) {
	forBackends(t, func(t *testing.T, rdb *redis.Client, opts []ratelimit.Option) {
		hook := &heldCall{ran: make(chan struct{}, 1)}
		rdb.AddHook(hook)
		for i, rt := range sequentialRouters {
			t.Run(rt.name, func(t *testing.T) {
				ip := "198.51.100." + strconv.Itoa(i+1)
				l := perIP(t, rdb, 1000, append(opts, ratelimit.WithCost(func(*http.Request) int { return 10 }), ratelimit.WithSettle(nil))...)
				open := make(chan struct{})
				key := "ratelimit:ip:ip:{" + ip + "}"
				var settleErr error
				h := rt.build(l, func(w http.ResponseWriter, r *http.Request) {
					hook.arm(key, open)
					ctx, cancel := context.WithTimeout(r.Context(), 50*time.Millisecond)
					defer cancel()
					settleErr = ratelimit.Settle(ctx, 3)
				})
				if w := send(h, "GET", "/work", ip); w.Code != http.StatusOK {
					t.Fatalf("status %d", w.Code)
				}
				if !errors.Is(settleErr, ratelimit.ErrSettlePending) || errors.Is(settleErr, ratelimit.ErrNotReverted) {
					t.Errorf("a settle Redis had not confirmed by its deadline: %v, want ErrSettlePending", settleErr)
				}
				close(open)
				<-hook.ran
				for deadline := time.Now().Add(redistest.DecisionTimeout); logs(t, rdb)[key] != 3; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the log holds %d, want the settled 3", logs(t, rdb)[key])
					}
				}
			})
		}
	})
}
