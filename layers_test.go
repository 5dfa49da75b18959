package ratelimit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLayers: no file of the package refers, directly or through others,
// to a file that refers to it: the files stand in layers (README, Design),
// each using only those below it.
func TestLayers(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// Other packages are left empty: only this package's names matter,
	// and type-checking the dependencies from source would take seconds.
	// The errors about their names are expected.
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: emptyImporter{}, Error: func(error) {}}
	pkg, _ := conf.Check("ratelimit", fset, files, info)
	// uses[a][b]: a name declared in file b is used in file a.
	uses := map[string]map[string]string{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if v, ok := obj.(*types.Var); ok && !v.IsField() && v.Parent() != pkg.Scope() {
			continue // a local variable
		}
		from, to := fset.File(id.Pos()).Name(), fset.File(obj.Pos()).Name()
		if from == to {
			continue
		}
		if uses[from] == nil {
			uses[from] = map[string]string{}
		}
		uses[from][to] = obj.Name()
	}
	// A depth-first walk finds any cycle.
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var stack []string
	var walk func(f string)
	walk = func(f string) {
		state[f] = open
		stack = append(stack, f)
		for g, name := range uses[f] {
			switch state[g] {
			case open:
				cycle := append(slices.Clone(stack[slices.Index(stack, g):]), g)
				t.Errorf("files refer to each other in a circle: %s (the last step uses %s)", strings.Join(cycle, " -> "), name)
			case unseen:
				walk(g)
			}
		}
		stack = stack[:len(stack)-1]
		state[f] = done
	}
	for _, p := range paths {
		if !strings.HasSuffix(p, "_test.go") && state[p] == unseen {
			walk(p)
		}
	}
}

// emptyImporter imports every package as an empty one.
type emptyImporter struct{}

func (emptyImporter) Import(path string) (*types.Package, error) {
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}
