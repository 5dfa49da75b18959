package ratelimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"
)

// Canonical header names, so that values can be assigned to the header map
// directly.
const (
	hdrLimit      = "X-Ratelimit-Limit"
	hdrRemaining  = "X-Ratelimit-Remaining"
	hdrReset      = "X-Ratelimit-Reset"
	hdrRetryAfter = "Retry-After"
	hdrRateLimit  = "Ratelimit"
	hdrPolicy     = "Ratelimit-Policy"
)

// ceilSeconds returns d in whole seconds, rounded up, and 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// writeHeaders sets the selected rate-limit headers for res, and Retry-After
// if res denied a request that can succeed later. The X-RateLimit fields
// and RateLimit describe the enforced limits the decision consulted;
// RateLimit-Policy lists the policies in force for the client, every
// enforced limit that counts it with its plan's quota, whichever way the
// decision was made (Redis, the deny cache, FailLocal's logs, a Cluster
// decision that stopped at a denying slot), so that it is the same for
// every request of one client to one route. Shadow limits appear in none:
// a decision that consulted only shadow limits (the enforced ones exempt
// the client by its plans) gets RateLimit-Policy alone, if any limit is in
// force.
func (rs *ruleset) writeHeaders(h http.Header, res *Result) {
	if res.index < 0 {
		return // no limit counts the client (Unlimited plans)
	}
	enforced := !res.Limits[res.index].Shadow // else only shadow limits were consulted
	if rs.cfg.headers&HeadersXRateLimit != 0 && enforced {
		h[hdrLimit] = rs.limits[res.index].tiers[res.Limits[res.index].tier].limitHdr
		h[hdrRemaining] = headerNumber(int64(res.Remaining))
		if res.Limits[res.index].InFlight {
			delete(h, hdrReset) // an in-flight limit promises no time
		} else {
			h[hdrReset] = headerNumber(resetSeconds(res.Reset))
		}
	}
	if rs.cfg.headers&HeadersIETF != 0 {
		var buf [256]byte // most headers fit: one allocation, the string
		b := buf[:0]
		// policy is the index of the plans in policyHeaders, or past its
		// end once it cannot be there: kept there, so that many limits of
		// many plans cannot overflow it.
		policy := 0
		for i, lr := range res.Limits {
			policy = min(policy*len(rs.limits[i].tiers)+lr.tier, len(rs.policyHeaders))
			if lr.Skipped || lr.Shadow {
				continue
			}
			if len(b) > 0 {
				b = append(b, ", "...)
			}
			b = append(b, rs.limits[i].tiers[lr.tier].quotedName...)
			b = append(b, ";r="...)
			b = strconv.AppendInt(b, int64(lr.Remaining), 10)
			if !lr.InFlight { // an in-flight limit promises no time
				b = append(b, ";t="...)
				b = strconv.AppendInt(b, ceilSeconds(lr.Reset.Sub(res.Now)), 10)
			}
		}
		if len(b) > 0 {
			h[hdrRateLimit] = []string{string(b)}
		}
		// RateLimit-Policy names every policy in force for the client,
		// those the decision did not consult included.
		var value []string
		if policy < len(rs.policyHeaders) {
			value = rs.policyHeaders[policy]
		} else {
			value = rs.policiesOf(res)
		}
		if value[0] != "" {
			h[hdrPolicy] = value
		}
	}
	if !res.Allowed && res.RetryAfter > 0 {
		h[hdrRetryAfter] = headerNumber(ceilSeconds(res.RetryAfter))
	}
}

// joinHeaders sets the headers of res on h, joined with those an earlier
// decision of the same request left there, so that the client sees one
// answer however many decisions it met: another Limiter further up the
// chain (a per-IP Limiter in front of authentication, a per-user one
// behind it, on the same Redis or another), or the first pass of the same
// Limiter when this is the decision of a route's own limits (see
// Limiter.rules). The X-RateLimit fields describe the limit closest to
// denying across the decisions: a denial's over an admission's, the later
// Retry-After's of two denials, else the fewest units remaining, then the
// later reset, then the smaller quota (as [Result] picks among one
// decision's limits); Retry-After is the later of two denials'; the
// RateLimit and RateLimit-Policy lists hold the items of every decision,
// the earlier first. The state is the response's headers themselves, so it
// is per request and costs nothing when one decision sets them: a few map
// lookups, and one allocation per joined list when several do.
func (rs *ruleset) joinHeaders(h http.Header, res *Result) {
	if res.index < 0 {
		return // no limit counts the client: the earlier decisions' headers stand
	}
	if len(h) == 0 {
		// No header yet, so no earlier decision's: nothing to join (the
		// usual case, a response's first decision, looks nothing up).
		rs.writeHeaders(h, res)
		return
	}
	limit, remaining, reset := h[hdrLimit], h[hdrRemaining], h[hdrReset]
	rateLimit, policy, retry := h[hdrRateLimit], h[hdrPolicy], h[hdrRetryAfter]
	rs.writeHeaders(h, res)
	// An earlier decision denied the request when it left Retry-After (a
	// later Limiter then runs only if the application carries on after
	// a refusal, as with Check): it is never hidden by a later admission.
	earlierDenied := len(retry) == 1
	if earlierDenied && !res.Allowed {
		if prev, ours := headerInt(retry), ceilSeconds(res.RetryAfter); res.RetryAfter <= 0 || prev >= ours {
			h[hdrRetryAfter] = retry
		}
	}
	wroteX := rs.cfg.headers&HeadersXRateLimit != 0 && !res.Limits[res.index].Shadow
	if wroteX && len(remaining) == 1 && len(limit) == 1 && len(reset) == 1 {
		keep := false
		switch {
		case earlierDenied && res.Allowed:
			keep = true
		case earlierDenied: // both denied: the one that frees up last
			keep = sameSlice(h[hdrRetryAfter], retry)
		case !res.Allowed:
			keep = false // a denial is closest to denying
		default:
			n, ours := headerInt(remaining), int64(res.Remaining)
			prevReset, ourReset := headerInt(reset), resetSeconds(res.Reset)
			keep = n < ours || n == ours && (prevReset > ourReset || prevReset == ourReset && headerInt(limit) < int64(res.Limit))
		}
		if keep {
			h[hdrLimit], h[hdrRemaining], h[hdrReset] = limit, remaining, reset
		}
	}
	joinList(h, hdrRateLimit, rateLimit)
	joinList(h, hdrPolicy, policy)
}

// headerInt returns the integer a header value holds, 0 if none.
func headerInt(v []string) int64 {
	if len(v) != 1 {
		return 0
	}
	n, _ := strconv.ParseInt(v[0], 10, 64)
	return n
}

// sameSlice reports whether a and b are the same header value (the same
// backing array).
func sameSlice(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// resetSeconds is t as X-RateLimit-Reset writes it: Unix seconds, rounded
// up.
func resetSeconds(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// joinList puts the items of first, a list field's earlier value, before
// the items h holds under name now.
func joinList(h http.Header, name string, first []string) {
	if now := h[name]; len(first) == 1 && first[0] != "" && len(now) == 1 && now[0] != "" {
		h[name] = []string{first[0] + ", " + now[0]}
	}
}

// policiesOf returns the RateLimit-Policy value of the limits in force for
// res's client: every enforced limit, with the client's plan, but those
// the plan exempts ([Unlimited]); consulted or not. It is what
// policyHeaders precomputes, for combinations of plans it does not hold.
func (rs *ruleset) policiesOf(res *Result) []string {
	var b []byte
	for i, lr := range res.Limits {
		t := &rs.limits[i].tiers[lr.tier]
		if lr.Shadow || t.quota < 0 {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, t.policy...)
	}
	return []string{string(b)}
}

// numbers caches header values of integers, so that writing the usual ones
// (remaining quota, reset times, delays) allocates nothing. The slices are
// shared between responses: handlers must not change their elements (they
// may replace or append to the header as usual).
var numbers [4096]numberSlot

// numberSlot is where numbers caches the value of one number modulo its
// length: n says which number v holds, so that a number not cached is
// told without reading v, which may have left the processor's caches long
// ago (it is read again through v, as n and v are stored one after the
// other).
type numberSlot struct {
	n atomic.Int64
	v atomic.Pointer[numberValue]
}

// numberIndex returns the index in numbers of n's slot: n modulo its
// length, the slots of consecutive numbers a cache line apart. A hot key's
// X-RateLimit-Remaining counts down by one a request, each a new value
// stored: on neighbouring slots, each core's store would make the others
// fetch the line again for the next one.
func numberIndex(n int64) int {
	const perLine = 4 // 64 bytes of slots
	lines := uint64(len(numbers)) / perLine
	i := uint64(n) % uint64(len(numbers))
	return int(i%lines*perLine + i/lines)
}

// numberValue is a header value of n, made in one allocation: the value's
// array and the bytes of its string are its own.
type numberValue struct {
	n      int64
	v      [1]string
	digits [20]byte // n in decimal: v[0]'s bytes, never written after v[0] is made
}

// headerNumber returns a header value holding n in decimal.
func headerNumber(n int64) []string {
	slot := &numbers[numberIndex(n)]
	if slot.n.Load() == n {
		if e := slot.v.Load(); e != nil && e.n == n {
			return e.v[:]
		}
	}
	e := &numberValue{n: n}
	b := strconv.AppendInt(e.digits[:0], n, 10) // 20 bytes hold any int64
	// The string shares the bytes, as strings.Builder's does: nothing
	// writes them again, so that it is as immutable as any string.
	e.v[0] = unsafe.String(&b[0], len(b))
	slot.v.Store(e)
	slot.n.Store(n)
	return e.v[:]
}

// Header values and bodies of the limiter's own answers, shared by every
// response (as headerNumber's are): a flood of denials allocates none of them.
var (
	textPlain       = []string{"text/plain; charset=utf-8"}
	problemJSON     = []string{"application/problem+json"}
	nosniff         = []string{"nosniff"}
	retryAfterOne   = []string{"1"}
	tooManyBody     = []byte("Too Many Requests\n")
	unavailableBody = []byte("Service Unavailable\n")
)

// tooManyRequests is the default answer to a denied request.
func tooManyRequests(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = textPlain
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(tooManyBody)
}

// ProblemDetails answers a denied request with 429 and an RFC 9457
// application/problem+json body of the quota-exceeded type from
// draft-ietf-httpapi-ratelimit-headers, naming the policies that denied it
// as RateLimit-Policy does:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"Too Many Requests","status":429,
//	 "detail":"Retry in 3 seconds.","violated-policies":["ip-per-1m"]}
//
// Use it with [Handlers].Denied.
func ProblemDetails(w http.ResponseWriter, _ *http.Request, res Result) {
	body := struct {
		Type     string   `json:"type"`
		Title    string   `json:"title"`
		Status   int      `json:"status"`
		Detail   string   `json:"detail,omitempty"`
		Violated []string `json:"violated-policies"`
	}{
		Type:   "https://iana.org/assignments/http-problem-types#quota-exceeded",
		Title:  "Too Many Requests",
		Status: http.StatusTooManyRequests,
	}
	for _, lr := range res.Limits {
		if lr.Denied && !lr.Shadow { // a shadow limit is not a policy
			body.Violated = append(body.Violated, lr.policyName())
		}
	}
	switch {
	case res.RetryAfter > 0:
		body.Detail = "Retry in " + strconv.FormatInt(ceilSeconds(res.RetryAfter), 10) + " seconds."
	case res.index >= 0 && res.index < len(res.Limits) && res.Limits[res.index].InFlight:
		body.Detail = "Too many requests in flight: retry once one of them ends."
	default:
		body.Detail = "The request costs more than the quota allows."
	}
	h := w.Header()
	h["Content-Type"] = problemJSON
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(body)
}

// serviceUnavailable answers a request the limiter could not decide, under
// FailClosed. It never echoes the error to the client.
func serviceUnavailable(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = textPlain
	h["X-Content-Type-Options"] = nosniff
	h[hdrRetryAfter] = retryAfterOne
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(unavailableBody)
}

// unauthorizedBody is the body of the default answer to a request with no
// key.
var unauthorizedBody = []byte("Unauthorized\n")

// unauthorized is the default answer to a request a Key cannot identify.
func unauthorized(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = textPlain
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write(unauthorizedBody)
}

// WithHeaders selects the rate-limit headers the middleware writes. Default:
// [HeadersXRateLimit]. Retry-After is always written on a 429 that can
// succeed later.
func WithHeaders(h HeaderSet) Option {
	return func(c *config) { c.headers = h }
}
