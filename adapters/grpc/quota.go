package grpcratelimit

import (
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/slidinglog/ratelimit"
)

// quotaFailure describes the limit that denied a call: d, what the
// Limiter recorded of it, or, if it recorded nothing (a call its own
// handler answered 429 without a denial), an anonymous violation.
func quotaFailure(d *ratelimit.Denial) *errdetails.QuotaFailure {
	v := &errdetails.QuotaFailure_Violation{Description: "rate limit exceeded"}
	if d != nil {
		v.Subject = "limit:" + d.Policy
		v.QuotaId = d.Policy
		v.QuotaValue = int64(d.Quota)
		v.Description = "rate limit " + strconv.Quote(d.Policy) + " exceeded: " + strconv.Itoa(d.Quota) + " per " + d.Window.String()
	}
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{v}}
}
