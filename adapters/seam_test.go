package adapters_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
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
			case strings.HasPrefix(path, "github.com/slidinglog/ratelimit/internal/"):
				t.Errorf("%s imports %s: an adapter uses the exported seam", p, path)
			}
		}
	}
	if seen < 4 {
		t.Errorf("found %d adapter files, want chi, echo, gin and grpc at least", seen)
	}
}

// TestModulesUseNoRootInternal: no module of this repository but the root
// one imports a package under the root module's internal/, in its code or
// its tests. Semantic versioning covers no internal package, so a released
// adapter, metrics exporter, example or tool that did could break when the
// root module changes one; they reach the root module through its public
// packages (redistest and store among them) alone. The one exception is
// this module, the conformance suite, which is never released and is
// tested at the root's own commit: its tests share the root's test-only
// packages, the caller-side oracle and the long-test switch.
func TestModulesUseNoRootInternal(t *testing.T) {
	const internal = "github.com/slidinglog/ratelimit/internal/"
	testOnly := map[string]bool{internal + "oracle": true, internal + "longtest": true}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	skipDir := func(name string) bool {
		return name == "testdata" || name == "node_modules" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
	}
	var modules []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && skipDir(d.Name()) {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" && filepath.Dir(p) != root {
			modules = append(modules, filepath.Dir(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(modules) < 9 {
		t.Fatalf("found %d modules besides the root one (%v), want adapters, its four routers, examples, two metrics exporters and the benchmark tool", len(modules), modules)
	}
	files := 0
	for _, mod := range modules {
		err := filepath.WalkDir(mod, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p == mod {
					return nil
				}
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil || skipDir(d.Name()) {
					return filepath.SkipDir // another module is walked on its own
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			files++
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(path, internal) && !(mod == self && strings.HasSuffix(p, "_test.go") && testOnly[path]) {
					rel, _ := filepath.Rel(root, p)
					t.Errorf("%s imports %s: a module other than the root one uses the root module's public packages alone", rel, path)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 40 {
		t.Errorf("read %d Go files in %d modules, want more: the walk missed them", files, len(modules))
	}
}
