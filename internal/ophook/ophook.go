// Package ophook lets the root package give the Operator a Limiter hands
// out ([ratelimit.Inspector.Operator]) what an Operator from operator.New
// lacks: the Limiter's clock, a reload of that Limiter after each change,
// and the lifting of the blocks the Limiter's own limits set.
package ophook

import (
	"context"
	"time"
)

// Hooks are the extras of a Limiter's Operator; a nil field keeps the
// Operator's own behaviour.
type Hooks struct {
	// Now is the clock expiries are computed and compared on.
	Now func() time.Time
	// After runs after a change that succeeded.
	After func(ctx context.Context)
	// Unblock lifts the blocks the Limiter's own limits set for id.
	Unblock func(ctx context.Context, id string) (bool, error)
}

// Configure gives o, an *operator.Operator, the hooks h. Package operator
// sets it when it is initialised, so it is set whenever an Operator exists.
var Configure func(o any, h Hooks)
