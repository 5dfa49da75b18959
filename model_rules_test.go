package ratelimit

import "github.com/slidinglog/ratelimit/internal/logmodel"

// The rules of TestModel's reference model (internal/logmodel) that only
// the limiter has: refunds, Reset, and keys another program writes.

// modelRefund is rule 3: the first refund of an admitted Result removes its
// entries (those still there: up to its cost of its time in each log it
// was logged in, entries of one time being interchangeable; none if only
// shadow limits without room counted it); any later
// refund, or one of a Result that was not admitted, removes nothing and
// must fail with ErrSettled or ErrNotAdmitted. It reports whether it must fail.
func modelRefund(s *logmodel.State, is *issuedResult, now int64) (wantErr bool) {
	if is.refunded || !is.admitted {
		return true
	}
	for _, p := range is.placed {
		modelCredit(s, p, p.N, now)
	}
	return false
}

// modelCredit takes n units of what p placed back, at now: an exact or
// bucketed log's entries (those still there), or what a token bucket's
// request still holds (see lua/gcra.lua).
func modelCredit(s *logmodel.State, p logmodel.Placed, n int, now int64) {
	if l := s.Limits[p.Ref.Limit]; l.TokenBucket {
		l.CreditBucket(s.Log(p.Ref), p.T, n, now)
		return
	}
	s.Log(p.Ref).Remove(p.T, n)
}

// modelReset is rule 5: Reset forgets the logs of ids, each limit's: an exact
// log's entries are removed, its time kept a unit later (State.Forget), and
// a key that holds no log deleted; a bucketed limit's fields are
// removed from the identifier's hash, its time kept a bucket later, which
// fails if another program holds the key. It lifts their blocks (rule 6), but where it fails. It
// reports whether Reset must fail.
func modelReset(s *logmodel.State, keys, ids []string, now int64) (wantErr bool) {
	for i, id := range ids {
		if s.Limits[i].Bucketed && s.Foreign[keys[i]] != "" {
			wantErr = true
			continue
		}
		at := int64(0) // an exact log's forget is not timed
		if s.Limits[i].TokenBucket {
			at = now // a token bucket's time is the reset's, if later
		}
		s.Forget(logmodel.LogRef{Limit: i, ID: id}, at)
		delete(s.Foreign, keys[i])
		delete(s.Blocked, logmodel.LogRef{Limit: i, ID: id}) // rule 6: Reset lifts a block
	}
	return wantErr
}

// modelTakeOver records that another program wrote key, which held the logs
// refs: they are gone.
func modelTakeOver(s *logmodel.State, key, kind string, refs []logmodel.LogRef) {
	s.Foreign[key] = kind
	for _, r := range refs {
		delete(s.Logs, r)
	}
}
