// Package adapters holds the tests that every router adapter must pass
// alike (the conformance suite), in a module of their own that requires all
// the routers, so that no adapter's module requires another's router. It
// has no API: import an adapter, such as
// github.com/slidinglog/ratelimit/adapters/chi.
package adapters
