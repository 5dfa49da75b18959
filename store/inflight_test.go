package store_test

import (
	"testing"

	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// TestLocalInFlightConformance runs the in-flight suite on store.Local,
// whose slots never expire: released by Refund with the holder ids, with
// clocks that step back ("keep") and forward only ("sweep").
//
//	go test -run TestLocalInFlightConformance -count=1 ./store
func TestLocalInFlightConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  storetest.Config
		opts store.LocalOptions
	}{
		{"keep", storetest.Config{}, store.LocalOptions{KeepExpired: true}},
		{"sweep", storetest.Config{Forward: true}, store.LocalOptions{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := storetest.InFlightConfig{Config: c.cfg, NeverExpire: true}
			storetest.RunInFlight(t, cfg, func(t *testing.T) store.Store {
				s, err := store.NewLocal(c.opts)
				if err != nil {
					t.Fatal(err)
				}
				return s
			})
		})
	}
}
