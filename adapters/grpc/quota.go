package grpcratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// quotaFailure describes the limit that denied a call, as far as the
// headers the Limiter set (h) tell.
//
// X-RateLimit-Limit is the quota of the limit that denied. The RateLimit
// field (HeadersIETF) lists every limit consulted as "name";r=R;t=T, and
// the one that denied has t equal to Retry-After (both are its delay
// rounded up) and fewer units left than any limit that admitted the call:
// that identifies it, or another limit that denied as well and frees up at
// the same second. A call whose cost exceeds a quota has no Retry-After:
// then the limit with the smallest quota is named.
func quotaFailure(h http.Header) *errdetails.QuotaFailure {
	v := &errdetails.QuotaFailure_Violation{Description: "rate limit exceeded"}
	if q, ok := firstInt(h["X-Ratelimit-Limit"]); ok {
		v.QuotaValue = q
	}
	if name, ok := deniedPolicy(h); ok {
		v.QuotaId = name
		v.Subject = "limit:" + name
		if q, w, ok := policy(h["Ratelimit-Policy"], name); ok {
			if v.QuotaValue == 0 {
				v.QuotaValue = q
			}
			if w > 0 {
				v.Description = "rate limit " + strconv.Quote(name) + " exceeded: " +
					strconv.FormatInt(v.QuotaValue, 10) + " per " + (time.Duration(w) * time.Second).String()
			} else {
				v.Description = "rate limit " + strconv.Quote(name) + " exceeded"
			}
		}
	}
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{v}}
}

// deniedPolicy returns the name of the policy in the RateLimit field of h
// that denied the call (see quotaFailure).
func deniedPolicy(h http.Header) (string, bool) {
	retry, hasRetry := firstInt(h["Retry-After"])
	best, bestR, bestQ := "", int64(-1), int64(-1)
	for _, line := range h["Ratelimit"] {
		for item := range strings.SplitSeq(line, ",") {
			name, params, ok := item1(item)
			if !ok {
				continue
			}
			r, _ := param(params, "r")
			if hasRetry {
				if t, _ := param(params, "t"); t != retry {
					continue
				}
				if bestR < 0 || r < bestR {
					best, bestR = name, r
				}
				continue
			}
			q, _, ok := policy(h["Ratelimit-Policy"], name)
			if ok && (bestQ < 0 || q < bestQ) {
				best, bestQ = name, q
			}
		}
	}
	return best, best != ""
}

// policy returns the quota and window (seconds, 0 if not given) of the
// policy named name in the RateLimit-Policy lines.
func policy(lines []string, name string) (q, w int64, ok bool) {
	for _, line := range lines {
		for item := range strings.SplitSeq(line, ",") {
			n, params, valid := item1(item)
			if !valid || n != name {
				continue
			}
			q, ok = param(params, "q")
			w, _ = param(params, "w")
			return q, w, ok
		}
	}
	return 0, 0, false
}

// item1 splits a structured-field list item `"name";a=1;b=2` into its
// unquoted name and its parameters (";a=1;b=2").
func item1(item string) (name, params string, ok bool) {
	item = strings.TrimSpace(item)
	quoted, err := strconv.QuotedPrefix(item)
	if err != nil {
		return "", "", false
	}
	name, err = strconv.Unquote(quoted)
	return name, item[len(quoted):], err == nil
}

// param returns the integer parameter key of params (";a=1;b=2").
func param(params, key string) (int64, bool) {
	for p := range strings.SplitSeq(params, ";") {
		k, v, found := strings.Cut(strings.TrimSpace(p), "=")
		if found && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// firstInt parses the first value of a header as an integer.
func firstInt(v []string) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
	return n, err == nil
}
