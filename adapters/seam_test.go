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
// seam, docs/adapters.md), and read no pointer through unsafe. Of the
// internal packages they may use only internal/route, to write the route
// templates they hand on in the canonical form.
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
				path != "github.com/slidinglog/ratelimit/internal/route":
				t.Errorf("%s imports %s: an adapter uses the exported seam", p, path)
			}
		}
	}
	if seen < 4 {
		t.Errorf("found %d adapter files, want chi, echo, gin and grpc at least", seen)
	}
}
