package redistest

import (
	"fmt"
	"testing"
)

// skipRecorder is a testing.TB whose Skipf records its message and stops
// the call it was made in, without skipping the test itself.
type skipRecorder struct {
	testing.TB
	skipped string
}

func (r *skipRecorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(r)
}

// TestNoClusterEnv: with NoClusterEnv=1, StartCluster skips its test
// before it looks for a server.
func TestNoClusterEnv(t *testing.T) {
	t.Setenv(NoClusterEnv, "1")
	rec := &skipRecorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != rec {
				panic(p)
			}
		}()
		StartCluster(rec, 3, 0)
		t.Errorf("StartCluster with %s=1 returned a Cluster", NoClusterEnv)
	}()
	if rec.skipped == "" {
		t.Errorf("StartCluster with %s=1 did not skip its test", NoClusterEnv)
	}
}
