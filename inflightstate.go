package ratelimit

// InFlight returns how many requests hold in-flight slots ([InFlight])
// through this Limiter, its routes included, in this process now: admitted
// and not yet released (their handler has not returned, or
// [Limiter.Release] was not called yet). 0 for a Limiter without in-flight
// limits. The metrics modules export it as a gauge.
func (in Inspector) InFlight() int {
	if in.l.holds == nil {
		return 0
	}
	return int(in.l.holds.inflight.Load())
}
