package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/slidinglog/ratelimit/internal/redislog"
	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// defaultOutageProbe is how often a Limiter asks a Redis it found
// unreachable whether it answers again.
const defaultOutageProbe = time.Second

// outageWatch says, once per outage, through the Limiter's logger (or
// slog.Default), that its Redis cannot be reached, why, and what the
// failure mode answers meanwhile; and, at Info, when Redis answers again.
//
// A failed call is only a suspicion: a decision can time out on a busy
// Redis. The first one starts a check, a PING given a second at least;
// if that fails too, the outage is said, and the check asks again every
// probe interval until Redis answers. Calls that fail meanwhile add
// nothing. It holds no reference to the Limiter, whose liveness it reads
// through alive.
type outageWatch struct {
	client  redis.UniversalClient
	addr    string // the client's address(es), for the messages
	answers string // what the failure mode answers, for the message
	timeout time.Duration
	every   time.Duration
	logger  *slog.Logger // nil: slog.Default at the time of saying
	alive   func() bool  // the Limiter is neither closed nor collected

	state atomic.Int32 // outageUp, outageChecking or outageDown
	// quietUntil (Unix nanoseconds): a check found Redis answering, and
	// failures until then are taken for slow calls, not an outage, so
	// that a busy Redis is not asked a PING per failed call.
	quietUntil atomic.Int64

	mu sync.Mutex
	// otherwise are told if the running check finds Redis answering: the
	// failures they saw were not an outage, so they speak for themselves.
	otherwise []func()
}

const (
	outageUp int32 = iota
	outageChecking
	outageDown
)

// newOutageWatch returns the outage watch of a Limiter on client with
// cfg's options, or nil without a client (WithStore).
func newOutageWatch(client redis.UniversalClient, cfg *config) *outageWatch {
	if client == nil {
		return nil
	}
	o := &outageWatch{client: client, addr: redisAddr(client), timeout: max(cfg.timeout, time.Second),
		every: cfg.outageProbe, logger: cfg.logger, alive: func() bool { return true }}
	if o.every <= 0 {
		o.every = defaultOutageProbe
	}
	switch cfg.failure {
	case FailOpen:
		o.answers = "failing open: requests are served without rate limits until it answers"
	case FailLocal:
		o.answers = "failing local: each process counts the limits in memory until it answers"
	default:
		o.answers = "failing closed: requests get 503 until it answers"
		if cfg.onFailed != nil {
			o.answers = "failing closed: requests get Handlers.Unavailable's answer until it answers"
		}
	}
	return o
}

// redisAddr returns the address of c's server, or the addresses of its
// nodes, or "" for a client of another type.
func redisAddr(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		return strings.Join(slices.Sorted(maps.Values(c.Options().Addrs)), ",")
	}
	return ""
}

// suspect reports whether err may say that Redis cannot be reached, and
// if so checks, unless a check runs or the outage was said already. If
// the check finds Redis answering, it calls otherwise (if not nil).
func (o *outageWatch) suspect(err error, otherwise func()) bool {
	if o == nil || !outageError(err) {
		return false
	}
	switch o.state.Load() {
	case outageDown:
		return true
	case outageUp:
		if time.Now().UnixNano() < o.quietUntil.Load() {
			return false
		}
	case outageChecking:
		if otherwise != nil {
			o.mu.Lock()
			// The check may have ended since: then otherwise is not
			// told, as the failure it saw is covered by what the check
			// found (an outage), or was passing.
			if o.state.Load() == outageChecking {
				o.otherwise = append(o.otherwise, otherwise)
			}
			o.mu.Unlock()
		}
		return true
	}
	if !o.state.CompareAndSwap(outageUp, outageChecking) {
		return o.suspect(err, otherwise) // another call started the check
	}
	if otherwise != nil {
		o.mu.Lock()
		o.otherwise = append(o.otherwise, otherwise)
		o.mu.Unlock()
	}
	go o.check()
	return true
}

// check asks Redis, says the outage if it does not answer, and then asks
// again every o.every until it does, or the Limiter is gone.
func (o *outageWatch) check() {
	err := o.ping()
	if !outageError(err) {
		o.mu.Lock()
		otherwise := o.otherwise
		o.otherwise = nil
		o.quietUntil.Store(time.Now().Add(o.every).UnixNano())
		o.state.Store(outageUp)
		o.mu.Unlock()
		for _, f := range otherwise {
			f()
		}
		return
	}
	o.mu.Lock()
	o.otherwise = nil
	o.state.Store(outageDown)
	o.mu.Unlock()
	since := time.Now()
	o.log().Warn(o.downMessage(err), slog.String("redis", o.addr), slog.Any("error", err))
	t := time.NewTicker(o.every)
	defer t.Stop()
	for range t.C {
		if !o.alive() {
			return
		}
		if err := o.ping(); !outageError(err) {
			o.state.Store(outageUp)
			o.log().Info(o.upMessage(time.Since(since)), slog.String("redis", o.addr))
			return
		}
	}
}

// ping asks Redis for a PING within o.timeout, and returns nil or the
// error of a server that does not answer: a reply (NOAUTH too) is an
// answer. A single server is asked through a client of its own, of one
// connection, that neither retries the command nor the dial: its error
// is the cause (a connection refused, say), where the Limiter's client,
// retrying, would report its deadline. Other clients are asked
// themselves.
func (o *outageWatch) ping() (err error) {
	defer func() {
		// A client (or a hook of it) that panics must not take the
		// process down from a goroutine the application does not know
		// of: the check then finds nothing to say.
		if p := recover(); p != nil {
			err = errPingPanicked
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if c, ok := o.client.(*redis.Client); ok {
		opt := c.Options()
		// Dialer dials as the client does (TLS included). No credentials:
		// any reply, NOAUTH too, says the server answers.
		probe := redis.NewClient(&redis.Options{Network: opt.Network, Addr: opt.Addr, Dialer: opt.Dialer,
			Protocol: 2, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1, PoolSize: 1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer probe.Close()
		return probe.Ping(ctx).Err()
	}
	return o.client.Ping(ctx).Err()
}

func (o *outageWatch) log() *slog.Logger {
	if o.logger != nil {
		return o.logger
	}
	return slog.Default()
}

// downMessage says that Redis does not answer, why, and what requests
// get meanwhile.
func (o *outageWatch) downMessage(err error) string {
	at := "Redis"
	if o.addr != "" {
		at = "Redis at " + o.addr
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("ratelimit: %s is unreachable (no answer within %v): %s", at, o.timeout, o.answers)
	}
	return fmt.Sprintf("ratelimit: %s is unreachable (%v): %s", at, err, o.answers)
}

// upMessage says that Redis answers again, after an outage of about d.
func (o *outageWatch) upMessage(d time.Duration) string {
	at := "Redis"
	if o.addr != "" {
		at = "Redis at " + o.addr
	}
	return fmt.Sprintf("ratelimit: %s answers again, after about %v: deciding in Redis again", at, d.Round(time.Second))
}

// errPingPanicked is ping's error when the client panicked: not an outage.
var errPingPanicked = errors.New("ratelimit: the Redis client panicked on PING")

// outageError reports whether err may say that Redis cannot serve any
// call: a connection refused, lost or timed out, or a server that is
// loading, busy with a script or without its primary. Not a reply about
// one call (a Lua error, NOPERM on a key, an unexpected reply), nor a
// client the application closed, nor a caller that gave up.
func outageError(err error) bool {
	switch {
	case err == nil, err == errPingPanicked, errors.Is(err, redis.ErrClosed), errors.Is(err, context.Canceled),
		errors.Is(err, slidinglog.ErrUnexpectedReply), errors.Is(err, redislog.ErrCircuitOpen):
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := strings.TrimPrefix(re.Error(), "ERR ")
		for _, p := range []string{"LOADING", "BUSY ", "MASTERDOWN"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true
}

// outageStore is the Redis store, its failures watched for an outage.
type outageStore struct {
	redislog.Store
	watch *outageWatch
}

func (s outageStore) Decide(ctx context.Context, q *redislog.Query, out *redislog.Outcome) error {
	err := s.Store.Decide(ctx, q, out)
	if err != nil {
		s.watch.suspect(err, nil)
	}
	return err
}
