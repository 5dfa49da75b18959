package ratelimit

import (
	"errors"
	"time"
)

// observerOf returns the Observer of the hooks o has as methods: Observe
// (Decision), ObserveDenial (Denial), ObserveWarning (Warning) and Watch
// (Limiter), so that the tests' recorders keep one shape.
func observerOf(o any) Observer {
	var ob Observer
	if d, ok := o.(interface {
		Observe(Result, error, time.Duration)
	}); ok {
		ob.Decision = d.Observe
	}
	if d, ok := o.(interface{ ObserveDenial(limit, id string) }); ok {
		ob.Denial = d.ObserveDenial
	}
	if w, ok := o.(interface{ ObserveWarning(Warning) }); ok {
		ob.Warning = w.ObserveWarning
	}
	if w, ok := o.(interface{ Watch(*Limiter) }); ok {
		ob.Limiter = w.Watch
	}
	return ob
}

// refused reports whether err says that a settle had nothing to apply: the
// Result admitted nothing ([ErrNotAdmitted]), was settled before
// ([ErrSettled]), or its context carries no settlement
// ([ErrSettlementOff]).
func refused(err error) bool {
	return errors.Is(err, ErrNotAdmitted) || errors.Is(err, ErrSettled) || errors.Is(err, ErrSettlementOff)
}
