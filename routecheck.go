package ratelimit

import (
	"maps"
	"net/http"
	"reflect"
	"slices"

	"github.com/slidinglog/ratelimit/internal/muxprobe"
	"github.com/slidinglog/ratelimit/route"
)

// probe asks a ServeMux about the routes near a WithRoutes entry, with the
// route rules of package route.
var probe = muxprobe.Rules{Split: splitTemplate, Valid: route.Validate}

// checkRoutesFrom is New's check of the route table against mux, the mux
// of WithRoutesFrom (nil for none): it refuses the entries the mux does
// not serve (route.CheckMux), when the mux has routes by then (it serves
// an entry, or has a route near one); a mux whose routes come after New
// is checked at Handler's first request.
func checkRoutesFrom(table map[string]RouteLimits, mux *http.ServeMux) error {
	if mux == nil || len(table) == 0 {
		return nil
	}
	for t := range table {
		m, p := splitTemplate(t)
		if p != route.Unmatched && route.Validate(t) == nil && (probe.Serves(mux, m, p) || len(probe.Near(mux, m, p)) > 0) {
			return route.CheckMux(templates(table), mux) // mux has routes
		}
	}
	return nil
}

// templates returns the templates of a route table.
func templates(table map[string]RouteLimits) []string {
	return slices.Collect(maps.Keys(table))
}

// redirectType is the type of the handler http.RedirectHandler returns,
// which a ServeMux answers its own redirects with.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusMovedPermanently))
