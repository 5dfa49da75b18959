package store_test

import (
	"testing"

	"github.com/slidinglog/ratelimit/store"
	"github.com/slidinglog/ratelimit/store/storetest"
)

// TestLocalConformance runs the conformance suite on store.Local. The
// suite steps its clocks back past windows after they moved on, and
// expects the logs it left to count again: the store keeps them
// (KeepExpired), as the sweep would drop them.
//
//	go test -run TestLocalConformance -count=1 ./store
func TestLocalConformance(t *testing.T) {
	storetest.Run(t, storetest.Config{}, func(t *testing.T) store.Store {
		s, err := store.NewLocal(store.LocalOptions{KeepExpired: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
