package clientip

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoRootImport: package clientip, and every package of the module it
// imports, leave the root package ratelimit out, so that the root may
// import clientip and clientip stays usable on its own.
func TestNoRootImport(t *testing.T) { checkNoRootImport(t, ".", "..") }

// checkNoRootImport fails t if the package in dir, or a package of the
// module (rooted at root) it imports directly or not, imports the
// module's root package.
func checkNoRootImport(t *testing.T, dir, root string) {
	const module = "github.com/slidinglog/ratelimit"
	seen := map[string]bool{}
	var walk func(dir, by string)
	walk = func(dir, by string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				switch {
				case path == module:
					t.Errorf("%s (imported by %s) imports the root package %s", f, by, module)
				case strings.HasPrefix(path, module+"/"):
					walk(filepath.Join(root, strings.TrimPrefix(path, module+"/")), f)
				}
			}
		}
	}
	walk(dir, "the test")
	if len(seen) < 2 {
		t.Errorf("walked %d packages; want the package and the internal ones it uses", len(seen))
	}
}
