package adapters_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/slidinglog/ratelimit"
	chiratelimit "github.com/slidinglog/ratelimit/adapters/chi"
	echoratelimit "github.com/slidinglog/ratelimit/adapters/echo"
	ginratelimit "github.com/slidinglog/ratelimit/adapters/gin"
)

// TestNilLimiterPanicsAtMount: mounting a nil *Limiter (New's error
// ignored) fails where the router is built, saying what to check, not at
// the first request with a nil dereference.
func TestNilLimiterPanicsAtMount(t *testing.T) {
	var l *ratelimit.Limiter
	for name, mount := range map[string]func(){
		"net/http": func() { l.Handler(nil) },
		"chi":      func() { chiratelimit.Middleware(l) },
		"echo":     func() { echoratelimit.Middleware(l) },
		"gin":      func() { ginratelimit.Middleware(l) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), "nil *") || !strings.Contains(fmt.Sprint(r), "New returned") {
					t.Errorf("mounting a nil Limiter: recovered %v, want a panic that names the nil Limiter and New's error", r)
				}
			}()
			mount()
		})
	}
}
