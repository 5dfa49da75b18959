package ratelimit

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPackagesUsableAlone: the packages split out of the root (clientip,
// route, operator, store, store/storetest, redisstore, redistest), and every package
// of the module they import, leave the root package out, so that the root
// may import them and each stays usable on its own.
func TestPackagesUsableAlone(t *testing.T) {
	dirs := []string{"clientip", "route", "operator", "store", "store/storetest", "redisstore", "redistest"}
	walked := 0
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) { walked += checkNoRootImport(t, dir) })
	}
	if walked <= len(dirs) {
		t.Errorf("walked %d packages from %d; want the module's packages they use too", walked, len(dirs))
	}
}

// checkNoRootImport fails t if the package in dir, or a package of the
// module it imports directly or not, imports the module's root package.
// It returns how many packages it read.
func checkNoRootImport(t *testing.T, dir string) int {
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
					walk(strings.TrimPrefix(path, module+"/"), f)
				}
			}
		}
	}
	walk(dir, "the test")
	return len(seen)
}
