// Package grpcratelimit rate-limits gRPC calls with a [ratelimit.Limiter]:
// the same limits, keys, per-route limits and failure modes as its HTTP
// middleware, decided once per unary call and once per stream, when it
// opens. A call's in-flight slots ([ratelimit.InFlight]) are held until its
// handler returns, a stream's until it ends.
//
//	import grpcratelimit "github.com/slidinglog/ratelimit/adapters/grpc"
//
//	api, err := ratelimit.New(rdb,
//		[]ratelimit.Limit{ratelimit.Per(time.Minute, 600, ratelimit.ClientIP()).Named("ip")},
//		ratelimit.WithRoutes(map[string]ratelimit.RouteLimits{
//			"/helloworld.Greeter/SayHello": {Limits: []ratelimit.Limit{
//				ratelimit.Per(time.Minute, 60, ratelimit.ClientIP()).Named("hello"),
//			}},
//		}))
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(auth, grpcratelimit.UnaryServerInterceptor(api)),
//		grpc.ChainStreamInterceptor(grpcratelimit.StreamServerInterceptor(api)),
//	)
//
// # What the Limiter sees
//
// Keys, skip, cost and handler functions receive an *http.Request view of
// the call:
//
//   - Method "POST", URL.Path and Pattern the full method name
//     ("/helloworld.Greeter/SayHello"), always with its leading slash
//     (grpc routes a :path without it, "helloworld.Greeter/SayHello", to
//     the same method, and so does the Limiter), so that [ratelimit.Route] keys count
//     per method and [ratelimit.WithRoutes] templates such as
//     "/helloworld.Greeter/SayHello" or "POST /helloworld.Greeter/SayHello"
//     apply to one method. A template names one method: "/helloworld.Greeter/"
//     matches no call (there is no subtree matching), so give each method
//     of a service its entry. A call to a method the server does not register,
//     which reaches the stream interceptor only under
//     [grpc.UnknownServiceHandler], has the Pattern
//     [route.Unmatched]: its method name is the client's choice.
//   - RemoteAddr the peer's address ([peer.FromContext]), so
//     [ratelimit.ClientIP] works as over HTTP, [clientip.TrustProxies]
//     included. A peer that is not an IP address (a Unix socket, bufconn)
//     has no ClientIP key.
//   - Header the incoming metadata under canonical header names
//     (x-forwarded-for as X-Forwarded-For, x-api-key as X-Api-Key), so that
//     [ratelimit.Header] and the trusted-proxy rules of ClientIP read it.
//     Binary metadata (keys ending in "-bin") and pseudo-headers are left
//     out; Host is the :authority.
//   - Context the call's context, so that a [ratelimit.User] key sees
//     what an earlier interceptor stored there and a plan's Of can read it.
//     The decision is cancelled with the call, and bounded by its deadline
//     (the client's grpc-timeout) when that is shorter than the Limiter's
//     timeout: a call that ends so before it is decided fails with the
//     context's code (codes.DeadlineExceeded, codes.Canceled) whatever the
//     failure mode, and tells the circuit breaker nothing about Redis.
//
// The view, its Header and the ResponseWriter the Limiter's handlers get
// are valid only during the decision: they are recycled for later calls,
// so functions the Limiter calls must not keep them.
//
// # What the client sees
//
// An admitted call gets the rate-limit headers as response header metadata,
// under lower-case names (x-ratelimit-limit, x-ratelimit-remaining,
// x-ratelimit-reset, ratelimit, ratelimit-policy, as
// [ratelimit.WithHeaders] selects), read by a client with [grpc.Header] or
// ClientStream.Header. A refused call gets them in the same place, with
// retry-after, and a status error:
//
//   - denied: codes.ResourceExhausted, with an [errdetails.RetryInfo] whose
//     delay is exactly when the call would fit (Retry-After is that delay
//     rounded up to a second; there is none when the call's cost exceeds
//     the quota, so that waiting never helps, nor when an in-flight limit
//     ([ratelimit.InFlight]) denied, which promises no time) and an
//     [errdetails.QuotaFailure] with one violation for the limit that
//     denied: its QuotaId is the policy name ("ip", or "ip.pro" for a
//     client on a plan), its Subject "limit:" and that name, its
//     QuotaValue the quota;
//   - not decided, under the failure mode ([ratelimit.FailClosed], or
//     [ratelimit.FailLocal] when the call's cost is below 1):
//     codes.Unavailable, with a RetryInfo of 1 second. The reason goes to
//     [ratelimit.Handlers].Error, never to the client;
//   - a Key cannot identify the call (no user in its context, a missing
//     metadata key; [ratelimit.ErrNoKey]) under the [ratelimit.Handlers].MissingKey
//     default: codes.Unauthenticated, "rate limiter cannot identify the
//     caller", with no RetryInfo (waiting does not help). The reason goes
//     to [ratelimit.Handlers].Error, never to the client.
//
// The headers are sent as header metadata rather than trailers so that a
// client reads them the same way whatever the outcome, as an HTTP client
// does; the status details travel in the trailers as usual.
//
// A Limiter with handlers of its own ([ratelimit.Handlers].Denied,
// [ratelimit.Handlers].Unavailable, [ratelimit.Handlers].MissingKey)
// still runs them; their body is
// dropped, and the status they write picks the code: 429 ResourceExhausted
// (with the details above), 401 Unauthenticated, 403 PermissionDenied,
// anything else (503 included, or no status at all) Unavailable. Only the
// rate-limit headers and Retry-After they leave become metadata.
//
// Refunds ([ratelimit.WithRefund]) are not made: they are decided from an
// HTTP status, which a gRPC call does not have.
package grpcratelimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/route"
)

// UnaryServerInterceptor returns an interceptor that decides every unary
// call with l before its handler runs (see the package doc for what l sees
// and what the client gets). Put it after the interceptors whose context
// values its keys read (authentication), with [grpc.ChainUnaryInterceptor].
// A call l admits reaches the handler with the rate-limit headers set as
// header metadata; a refused one gets a status error and never reaches it.
// It does not panic: a Limiter that cannot decide applies its failure mode.
// The handler's context carries l's pass over the call, so that the same
// Limiter further down the chain counts the call once; with settlement on
// ([ratelimit.WithSettle], [ratelimit.WithRefund]) it carries the call's
// settlement too: the handler settles the call at its real cost with
// [ratelimit.Settle](ctx, n), and charges it as it goes with
// [ratelimit.Charge](ctx, n). When a charge spends the budget of a limit
// that stops ([ratelimit.Limit.Stopping]), the handler's context is
// cancelled (its cause the charge's error), and the call ends with
// ResourceExhausted, whose message names the limit, whatever the handler
// returns then (the rate-limit headers went out when the call was
// admitted).
func UnaryServerInterceptor(l *ratelimit.Limiter) grpc.UnaryServerInterceptor {
	if l == nil {
		panic("grpcratelimit: UnaryServerInterceptor of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, passed, c, err := decide(ctx, l, info.FullMethod, true)
		defer c.leave() // after the handler: its in-flight slots are held until it returns
		if md != nil {
			_ = grpc.SetHeader(ctx, md) // fails only without a transport stream, as in direct calls
		}
		if err != nil {
			return nil, err
		}
		resp, err := handler(passed, req)
		if spent := budgetSpent(passed); spent != nil {
			return nil, spent
		}
		return resp, err
	}
}

// budgetSpent returns the status of a call that a charge stopped
// ([ratelimit.Charge], [ratelimit.Limit.Stopping]): ResourceExhausted,
// whose message is the charge's error (it names the limit); nil if ctx
// was not cancelled so.
func budgetSpent(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, ratelimit.ErrBudgetSpent) {
		return status.Error(codes.ResourceExhausted, cause.Error())
	}
	return nil
}

// StreamServerInterceptor returns an interceptor that decides every stream
// with l once, when it opens, before its handler runs: the messages that
// follow are not counted. Otherwise it is [UnaryServerInterceptor]; chain
// it with [grpc.ChainStreamInterceptor]. The rate-limit headers are set
// with ss.SetHeader, so they go out with the handler's first message or
// its own headers. The stream's Context carries l's pass over the call and,
// with settlement on, the call's settlement, for [ratelimit.Settle] and
// [ratelimit.Charge]: a server-streaming handler charges what each
// message costs as it sends it, and a charge that spends the budget of a
// limit that stops ([ratelimit.Limit.Stopping]) cancels the stream's
// Context; the stream then ends with ResourceExhausted, whose message
// names the limit, whatever the handler returns (the messages it sent
// before stay sent).
func StreamServerInterceptor(l *ratelimit.Limiter) grpc.StreamServerInterceptor {
	if l == nil {
		panic("grpcratelimit: StreamServerInterceptor of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		// grpc passes no service implementation for a method it does not
		// register (grpc.UnknownServiceHandler).
		ctx := ss.Context()
		md, passed, c, err := decide(ctx, l, info.FullMethod, srv != nil)
		defer c.leave() // after the stream's handler: its in-flight slots are held until it returns
		if md != nil {
			_ = ss.SetHeader(md) // fails only once headers were sent, which they cannot be yet
		}
		if err != nil {
			return err
		}
		if passed != ctx {
			c.stream = passedStream{ServerStream: ss, ctx: passed}
			ss = &c.stream // c is recycled once the handler has returned
		}
		err = handler(srv, ss)
		if spent := budgetSpent(passed); spent != nil {
			return spent
		}
		return err
	}
}

// passedStream is a stream whose context carries the Limiter's pass over
// the call, and its settlement, for ratelimit.Settle.
type passedStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the stream's context, with the pass.
func (s *passedStream) Context() context.Context { return s.ctx }

// call is the scratch space of one decision, recycled through calls.
type call struct {
	url    url.URL
	header http.Header
	w      writer
	req    http.Request   // the view of the call the Limiter's pass is given
	pass   ratelimit.Pass // the Limiter's pass over the call, until leave
	stream passedStream   // a stream's, with the pass's context
}

var calls = sync.Pool{New: func() any {
	return &call{header: make(http.Header, 8), w: writer{h: make(http.Header, 8)}}
}}

// decide decides the call to method with l. It returns the metadata to send
// as headers (nil if none), the context to hand the handler (ctx's
// descendant that carries the Limiter's pass over the call and, with
// settlement on, its settlement, for ratelimit.Settle), the call, whose
// leave the caller defers once the handler has returned (the Limiter's
// pass over the call ends there, and with it the call's in-flight slots),
// and, if the call may not proceed, its status error. registered reports
// whether the server registers method.
func decide(ctx context.Context, l *ratelimit.Limiter, method string, registered bool) (metadata.MD, context.Context, *call, error) {
	c := calls.Get().(*call)
	md, passed, err := c.decide(ctx, l, method, registered)
	return md, passed, c, err
}

// leave ends the Limiter's pass over the call, which releases its
// in-flight slots, and recycles c. A call has no HTTP response to settle
// by: its handler settles with ratelimit.Settle.
func (c *call) leave() {
	c.pass.Done(-1, nil)
	c.pass = ratelimit.Pass{}
	c.put()
}

// decide is decide with c.
func (c *call) decide(ctx context.Context, l *ratelimit.Limiter, method string, registered bool) (metadata.MD, context.Context, error) {
	method = fullMethod(method)
	base := http.Request{
		Method:     http.MethodPost,
		URL:        &c.url,
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Header:     c.header,
		Body:       http.NoBody,
		RequestURI: method,
		Pattern:    method,
	}
	c.url.Path = method
	if !registered {
		base.Pattern = route.Unmatched
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		base.RemoteAddr = addrString(p.Addr)
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for k, v := range md {
			switch {
			case k == "" || strings.HasSuffix(k, "-bin"):
			case k[0] == ':':
				if k == ":authority" && len(v) > 0 {
					base.Host = v[0]
				}
			default:
				c.header[canonicalKey(k)] = v
			}
		}
	}
	c.req = *base.WithContext(ctx)
	// A later pass if ctx carries l's pass already (l's interceptor twice
	// in a chain).
	var req *http.Request
	c.pass, req = l.Enter(&c.req)
	v, err := c.pass.Decide(&c.w, req)
	if err != nil && ctx.Err() != nil {
		// The call ended (its client's deadline, a cancellation) before it
		// was decided: it ends so, whatever the failure mode, so that a
		// client cannot pass a fail-open Limiter uncounted by giving its
		// calls no time.
		return nil, nil, status.FromContextError(ctx.Err()).Err()
	}
	md := headerMD(c.w.h)
	switch v {
	case ratelimit.Proceed:
		return md, req.Context(), nil
	case ratelimit.Denied:
		return md, nil, c.w.refusal(codes.ResourceExhausted)
	case ratelimit.Unavailable:
		return md, nil, c.w.refusal(codes.Unavailable)
	case ratelimit.NoKey:
		return md, nil, c.w.refusal(codes.Unauthenticated)
	}
	// Answered by the Limiter's own handler: its status picks the code.
	switch c.w.status {
	case http.StatusTooManyRequests:
		return md, nil, c.w.refusal(codes.ResourceExhausted)
	case http.StatusUnauthorized:
		return md, nil, c.w.refusal(codes.Unauthenticated)
	case http.StatusForbidden:
		return md, nil, c.w.refusal(codes.PermissionDenied)
	}
	return md, nil, c.w.refusal(codes.Unavailable)
}

// fullMethod returns the full method name grpc routes the :path method to,
// written with its leading slash: grpc-go's server strips one leading '/'
// if there is one and routes "grpc.health.v1.Health/Watch" to the same
// method as "/grpc.health.v1.Health/Watch", but hands the interceptors
// the :path as the client sent it. It allocates only for a path without
// the slash.
func fullMethod(method string) string {
	if method == "" || method[0] != '/' {
		return "/" + method
	}
	return method
}

// put clears c and recycles it.
func (c *call) put() {
	clear(c.header)
	clear(c.w.h)
	c.w.status, c.w.denied = 0, false
	c.url, c.req, c.stream = url.URL{}, http.Request{}, passedStream{}
	calls.Put(c)
}

// writer is the ResponseWriter the Limiter decides with: it keeps the
// headers, the first final status and the details of a denial, and drops
// the body.
type writer struct {
	h      http.Header
	status int
	denied bool
	denial denial // if denied
}

// The Limiter gives writer a denial's details.
var _ interface{ RecordDenial(ratelimit.Result) } = (*writer)(nil)

// RecordDenial keeps the details of a denial (see ratelimit.Pass.Decide).
func (w *writer) RecordDenial(res ratelimit.Result) { w.denied, w.denial = true, denialOf(res) }

// Header returns the headers set so far.
func (w *writer) Header() http.Header { return w.h }

// Write drops b, as a gRPC call has no HTTP body to write it to.
func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

// WriteHeader keeps the first final status.
func (w *writer) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

// The headers that become metadata: the canonical names the Limiter sets,
// and the metadata keys they are sent under.
var forwarded = [...]struct{ header, key string }{
	{"X-Ratelimit-Limit", "x-ratelimit-limit"},
	{"X-Ratelimit-Remaining", "x-ratelimit-remaining"},
	{"X-Ratelimit-Reset", "x-ratelimit-reset"},
	{"Ratelimit", "ratelimit"},
	{"Ratelimit-Policy", "ratelimit-policy"},
	{"Retry-After", "retry-after"},
}

// headerMD returns the rate-limit headers of h as metadata, nil if there
// are none. The values are h's own slices, which the Limiter shares
// between responses: metadata.MD's users copy rather than change them.
func headerMD(h http.Header) metadata.MD {
	var md metadata.MD
	for _, f := range forwarded {
		if v, ok := h[f.header]; ok && len(v) > 0 {
			if md == nil {
				md = make(metadata.MD, len(forwarded))
			}
			md[f.key] = v
		}
	}
	return md
}

// refusal returns the status error of a call refused with code, with the
// details the decision gave: RetryInfo (for a denial, exactly when the call
// would fit; else from Retry-After, in seconds), and for ResourceExhausted
// a QuotaFailure naming the limit.
func (w *writer) refusal(code codes.Code) error {
	var msg string
	switch code {
	case codes.ResourceExhausted:
		msg = "rate limit exceeded"
	case codes.Unavailable:
		msg = "rate limiter unavailable"
	case codes.Unauthenticated:
		msg = "rate limiter cannot identify the caller"
	default:
		msg = "rate limiter refused the call"
	}
	var d *denial
	delay := retryAfter(w.h)
	if w.denied {
		d, delay = &w.denial, w.denial.retryAfter
	}
	if delay > 0 {
		msg += ": retry in " + delay.String()
	}
	st := status.New(code, msg)
	var details []protoadapt.MessageV1
	if delay > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	if code == codes.ResourceExhausted {
		details = append(details, quotaFailure(d))
	}
	if len(details) == 0 {
		return st.Err()
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil { // unreachable: the details are well-formed messages
		return st.Err()
	}
	return withDetails.Err()
}

// retryAfter returns the delay of a Retry-After header in seconds, 0 if
// there is none.
func retryAfter(h http.Header) time.Duration {
	v := h["Retry-After"]
	if len(v) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || n <= 0 || n > int64(24*365*time.Hour/time.Second) {
		return 0
	}
	return time.Duration(n) * time.Second
}

// canonicalKey returns http.CanonicalHeaderKey(k), from a cache of recent
// keys so that the usual metadata costs no allocation. The cache has a
// fixed size: keys a client makes up evict one another, they cannot grow
// it.
func canonicalKey(k string) string {
	slot := &canonical[maphash.String(canonicalSeed, k)%uint64(len(canonical))]
	if e := slot.Load(); e != nil && e.key == k {
		return e.canonical
	}
	e := &canonicalEntry{key: strings.Clone(k), canonical: http.CanonicalHeaderKey(k)}
	slot.Store(e)
	return e.canonical
}

type canonicalEntry struct{ key, canonical string }

var (
	canonical     [256]atomic.Pointer[canonicalEntry]
	canonicalSeed = maphash.MakeSeed()
)

// addrString returns a.String(), from a cache of recent TCP peers'
// addresses: grpc gives every call of a connection the connection's own
// *net.TCPAddr, so the calls of a connection format it once. An entry keeps
// its address alive, so a cached pointer is never reused for another
// address; the cache has a fixed size. Other kinds of address, which may
// not even be comparable, are formatted on every call.
func addrString(a net.Addr) string {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	slot := &addrs[maphash.Comparable(canonicalSeed, t)%uint64(len(addrs))]
	if e := slot.Load(); e != nil && e.addr == t {
		return e.s
	}
	e := &addrEntry{addr: t, s: t.String()}
	slot.Store(e)
	return e.s
}

type addrEntry struct {
	addr *net.TCPAddr
	s    string
}

var addrs [256]atomic.Pointer[addrEntry]

// CheckRoutes reports every [ratelimit.WithRoutes] entry of l that no
// method of s serves, so that its limits would never apply: a typo in a
// service or method name ("/helloworld.Greeter/SayHelo"), a method other
// than POST ("GET /helloworld.Greeter/SayHello": every call is decided as
// a POST), a service prefix ("/helloworld.Greeter/": a template names one
// method). The error names each such entry and the nearest method, and
// wraps [route.ErrUnmatched]; nil if every entry names a method
// of s (see [route.Check]). s is the server (a
// *grpc.Server, or anything with its GetServiceInfo), with its services
// registered: call CheckRoutes before Serve, or in a test. The
// interceptors cannot check this themselves, as they do not see the
// server.
func CheckRoutes(l *ratelimit.Limiter, s interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}) error {
	if s == nil {
		return errors.New("grpcratelimit: CheckRoutes: nil server")
	}
	var routes []string
	for name, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			routes = append(routes, http.MethodPost+" /"+name+"/"+m.Name)
		}
	}
	if l == nil {
		return errors.New("grpcratelimit: CheckRoutes of a nil *ratelimit.Limiter: check the error ratelimit.New returned")
	}
	return check(l, routes)
}

// check is route.Check of l's route table ([ratelimit.Stats].Routes)
// against a router's routes, its error prefixed as the Limiter's own.
func check(l *ratelimit.Limiter, routes []string) error {
	if err := route.Check(l.Inspect().Stats().Routes, routes); err != nil {
		return fmt.Errorf("ratelimit: %w", err)
	}
	return nil
}
