package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// write creates the files of tree (path -> content) under dir.
func write(t *testing.T, dir string, tree map[string]string) {
	t.Helper()
	for p, content := range tree {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestModuleAPI(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{
		"go.mod": "module github.com/slidinglog/m\n\ngo 1.25.0\n",
		"m.go": `package m

import "errors"

const (
	A Mode = iota
	B
	c
)

const Size = size * 2
const size = 64

var ErrX = errors.New("x")

type Mode uint8

type S struct {
	Exported, Two int
	hidden  string
	Fn      func(ctx any, id string) (string, error)
	*Embedded
}

type Embedded struct{}

type I interface {
	Do(n int) error
	private()
}

type G[T any] struct{ V T }

func New(name string, opts ...Mode) (*S, error) { return nil, nil }
func (s *S) Method(a, b int) bool                 { return false }
func (s S) value()                                {}
func (g G[T]) Get() T                             { return g.V }
func F[T comparable](v T) T                       { return v }
`,
		"m_test.go":         "package m\n\nfunc TestOnly() {}\n",
		"internal/x/x.go":   "package x\n\nfunc Hidden() {}\n",
		"cmd/tool/main.go":  "package main\n\nfunc Exported() {}\n",
		"testdata/t/t.go":   "package t\n\nfunc Data() {}\n",
		"sub/go.mod":        "module github.com/slidinglog/m/sub\n\ngo 1.25.0\n",
		"sub/sub.go":        "package sub\n\nfunc Other() {}\n",
		"pub/pub.go":        "package pub\n\nvar V = 3\n",
		"pub/other_os.go":   "//go:build ignore\n\npackage pub\n\nfunc Ignored() {}\n",
		"pub/nested/doc.go": "// Package nested has nothing exported.\npackage nested\n",
	})
	got, err := moduleAPI(module{dir: dir, path: "github.com/slidinglog/m"})
	if err != nil {
		t.Fatal(err)
	}
	p := "pkg github.com/slidinglog/m, "
	want := []string{
		p + "const A Mode = 0",
		p + "const B Mode = 1",
		p + "const Size = 128",
		p + "func F[T comparable](T) T",
		p + "func New(string, ...Mode) (*S, error)",
		p + "method (*S) Method(int, int) bool",
		p + "method (G) Get() T",
		p + "type Embedded struct",
		p + "type G[T any] struct",
		p + "type G[T any] struct, V T",
		p + "type I interface { Do, private }",
		p + "type I interface, Do(int) error",
		p + "type Mode uint8",
		p + "type S struct",
		p + "type S struct, Exported int",
		p + "type S struct, Fn func(any, string) (string, error)",
		p + "type S struct, Two int",
		p + "type S struct, embedded *Embedded",
		p + "var ErrX error",
		"pkg github.com/slidinglog/m/pub, var V = 3",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("moduleAPI:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The comparison: the files written by -w compare equal, and a change
	// in the code is reported.
	if err := run(dir, true); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"m.txt", "m.sub.txt"} {
		if _, err := os.Stat(filepath.Join(dir, "api", f)); err != nil {
			t.Errorf("run -w wrote no api/%s: %v", f, err)
		}
	}
	if err := run(dir, false); err != nil {
		t.Errorf("run after -w: %v", err)
	}
	write(t, dir, map[string]string{"pub/more.go": "package pub\n\nfunc More() {}\n"})
	if err := run(dir, false); err == nil {
		t.Error("run with a new exported function: no error")
	}
}
