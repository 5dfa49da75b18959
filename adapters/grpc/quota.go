package grpcratelimit

import (
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/slidinglog/ratelimit"
)

// denial is what a denied call's decision says of the limit that denied
// it.
type denial struct {
	policy     string // the limit as RateLimit-Policy names it: "<limit>" or "<limit>.<plan>"
	quota      int    // its quota (the plan's)
	window     time.Duration
	retryAfter time.Duration // when the call would fit, exactly; 0 if never
}

// denialOf returns what res, a Result that denied a call, says of the
// limit that denied it.
func denialOf(res ratelimit.Result) denial {
	d := denial{policy: res.DeniedBy, retryAfter: res.RetryAfter}
	for _, lr := range res.Limits {
		if lr.Name == res.DeniedBy && lr.Denied {
			d.quota, d.window = lr.Quota, lr.Window
			if lr.Plan != "" {
				d.policy += "." + lr.Plan
			}
			break
		}
	}
	return d
}

// quotaFailure describes the limit that denied a call: d, what the
// Limiter recorded of it, or, if it recorded nothing (a call its own
// handler answered 429 without a denial), an anonymous violation.
func quotaFailure(d *denial) *errdetails.QuotaFailure {
	v := &errdetails.QuotaFailure_Violation{Description: "rate limit exceeded"}
	if d != nil {
		v.Subject = "limit:" + d.policy
		v.QuotaId = d.policy
		v.QuotaValue = int64(d.quota)
		v.Description = "rate limit " + strconv.Quote(d.policy) + " exceeded: " + strconv.Itoa(d.quota) + " per " + d.window.String()
	}
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{v}}
}
