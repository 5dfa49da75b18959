package ratelimit

// A DenialObserver is an [Observer] that also wants to know whom a limit
// denied: the admin package's heavy-hitters sketch. Give it to
// [WithObserver]; after the Observe of each decision that denied a
// request (from Redis, from the deny cache, [WithDenyCache], or from
// [FailLocal]'s count), the Limiter calls ObserveDenial with the name of
// the limit that denied (Result.DeniedBy) and the identifier that limit's
// [Key] gave the request, or [Limiter.Allow] was given. Shadow limits
// deny nothing and are not reported, nor are requests no decision could
// be made for. The identifier is the client's: hostile input, of any
// length. ObserveDenial runs on the request's goroutine, and must be fast
// and safe for concurrent use; it may keep the strings.
type DenialObserver interface {
	Observer
	ObserveDenial(limit, id string)
}

// observeDenial reports res's denial, if it is one, to the
// DenialObservers: the limit that denied and its identifier among ids.
func (l *Limiter) observeDenial(ids []string, res *Result, err error) {
	if res.Allowed || err != nil && !res.Local || res.index < 0 || res.index >= len(ids) {
		return
	}
	for _, o := range l.cfg.observers {
		if d, ok := o.(DenialObserver); ok {
			d.ObserveDenial(res.DeniedBy, ids[res.index])
		}
	}
}
