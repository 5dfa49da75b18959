package adapters_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAdaptersUseExportedAPI: the built-in adapters reach package ratelimit
// through its exported API alone, as a third party's would (the adapter
// seam, docs/adapters.md), and read no pointer through unsafe. They use no
// internal package of the ratelimit module: the route templates they hand
// on are written in the canonical form by the public package route.
func TestAdaptersUseExportedAPI(t *testing.T) {
	paths, err := filepath.Glob("*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		seen++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case path == "unsafe":
				t.Errorf("%s imports unsafe", p)
			case strings.HasPrefix(path, "github.com/slidinglog/ratelimit/internal/") &&
				path != "github.com/slidinglog/ratelimit/route":
				t.Errorf("%s imports %s: an adapter uses the exported seam", p, path)
			}
		}
	}
	if seen < 4 {
		t.Errorf("found %d adapter files, want chi, echo, gin and grpc at least", seen)
	}
}
