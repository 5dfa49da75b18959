package store_test

import (
	"testing"

	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// TestLocalConformance runs the conformance suite on store.Local: with
// clocks that step back past windows after they moved on, on a store
// that keeps every log (KeepExpired), as the sweep would drop them
// ("keep"); and with one clock that only steps forward, on a store that
// sweeps ("sweep").
//
//	go test -run TestLocalConformance -count=1 ./store
func TestLocalConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  storetest.Config
		opts store.LocalOptions
	}{
		{"keep", storetest.Config{}, store.LocalOptions{KeepExpired: true}},
		{"sweep", storetest.Config{Forward: true}, store.LocalOptions{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			storetest.Run(t, c.cfg, func(t *testing.T) store.Store {
				s, err := store.NewLocal(c.opts)
				if err != nil {
					t.Fatal(err)
				}
				return s
			})
		})
	}
}

// TestLocalFeatureConformance runs the suites of the optional interfaces
// on store.Local, which implements them all.
//
//	go test -run TestLocalFeatureConformance -count=1 ./store
func TestLocalFeatureConformance(t *testing.T) {
	newLocal := func(t *testing.T) store.Store { return new(store.Local) }
	t.Run("Settler", func(t *testing.T) { storetest.RunSettler(t, storetest.Config{Forward: true}, newLocal) })
	t.Run("Forgetter", func(t *testing.T) { storetest.RunForgetter(t, storetest.Config{Forward: true}, newLocal) })
}
