// Command apicheck records the exported API of every module of the
// repository in api/, one file per module, and checks that the files match
// the code.
//
// Run from the repository's root:
//
//	go run ./internal/cmd/apicheck      # compare; exit status 1 and a diff when they differ
//	go run ./internal/cmd/apicheck -w   # write the files
//
// A module is a directory with a go.mod (testdata and hidden directories
// left out). Its packages are its directories with Go files, but for
// internal/ directories, main packages, testdata and nested modules; test
// files are not read. Each file lists, sorted, one line per exported name:
// functions, methods of exported types, types, each exported struct field
// and interface method, constants and variables, with their signatures or
// types (parameter names left out, as they are no part of the API). A
// constant shows its value where the package's own files give it, else the
// expression it is declared with. A variable without an
// explicit type shows its value's expression, but for an error (a call of
// errors.New or fmt.Errorf, or a name that begins with Err), which shows as
// type error.
//
// A module without exported API (only main or internal packages) gets no
// file. The file of module path github.com/slidinglog/ratelimit/adapters/chi
// is api/ratelimit.adapters.chi.txt: the path after github.com/slidinglog/,
// with dots for slashes.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// owner is the part of every module path the file names leave out.
const owner = "github.com/slidinglog/"

func main() {
	write := flag.Bool("w", false, "write the API files instead of comparing them")
	dir := flag.String("C", ".", "the repository's root")
	flag.Parse()
	if err := run(*dir, *write); err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
}

func run(root string, write bool) error {
	mods, err := modules(root)
	if err != nil {
		return err
	}
	want := map[string][]string{} // file name under api/ -> lines
	for _, m := range mods {
		lines, err := moduleAPI(m)
		if err != nil {
			return err
		}
		if len(lines) == 0 {
			continue
		}
		want[fileName(m.path)] = lines
	}
	apiDir := filepath.Join(root, "api")
	have := map[string][]string{}
	entries, err := os.ReadDir(apiDir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".txt") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(apiDir, e.Name()))
		if err != nil {
			return err
		}
		have[e.Name()] = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	}
	if write {
		if err := os.MkdirAll(apiDir, 0o755); err != nil {
			return err
		}
		for name := range have {
			if _, ok := want[name]; !ok {
				if err := os.Remove(filepath.Join(apiDir, name)); err != nil {
					return err
				}
			}
		}
		for name, lines := range want {
			if err := os.WriteFile(filepath.Join(apiDir, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	var diff bytes.Buffer
	names := make([]string, 0, len(want)+len(have))
	for name := range want {
		names = append(names, name)
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		removed, added := setDiff(have[name], want[name])
		if len(removed) == 0 && len(added) == 0 {
			continue
		}
		fmt.Fprintf(&diff, "api/%s:\n", name)
		for _, l := range removed {
			fmt.Fprintf(&diff, "-%s\n", l)
		}
		for _, l := range added {
			fmt.Fprintf(&diff, "+%s\n", l)
		}
	}
	if diff.Len() > 0 {
		os.Stdout.Write(diff.Bytes())
		return fmt.Errorf("the exported API differs from api/ (lines - only in api/, + only in the code); if the change is meant, run go run ./internal/cmd/apicheck -w and commit api/")
	}
	return nil
}

// setDiff returns the lines of a not in b and of b not in a, in order.
func setDiff(a, b []string) (onlyA, onlyB []string) {
	inA := map[string]bool{}
	for _, l := range a {
		inA[l] = true
	}
	inB := map[string]bool{}
	for _, l := range b {
		inB[l] = true
	}
	for _, l := range a {
		if !inB[l] {
			onlyA = append(onlyA, l)
		}
	}
	for _, l := range b {
		if !inA[l] {
			onlyB = append(onlyB, l)
		}
	}
	return onlyA, onlyB
}

func fileName(modPath string) string {
	return strings.ReplaceAll(strings.TrimPrefix(modPath, owner), "/", ".") + ".txt"
}

type module struct {
	dir, path string
}

// modules finds every go.mod under root.
func modules(root string) ([]module, error) {
	var mods []module
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		mp, err := modulePath(p)
		if err != nil {
			return err
		}
		mods = append(mods, module{dir: filepath.Dir(p), path: mp})
		return nil
	})
	slices.SortFunc(mods, func(a, b module) int { return strings.Compare(a.path, b.path) })
	return mods, err
}

func skipDir(name string) bool {
	return name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// modulePath reads the module directive of the go.mod file at p.
func modulePath(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "module" {
			if s, err := strconv.Unquote(fields[1]); err == nil {
				return s, nil
			}
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no module directive", p)
}

// moduleAPI returns the sorted API lines of the module m.
func moduleAPI(m module) ([]string, error) {
	var lines []string
	err := filepath.WalkDir(m.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != m.dir {
			if skipDir(d.Name()) || d.Name() == "internal" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		rel, err := filepath.Rel(m.dir, p)
		if err != nil {
			return err
		}
		pkgPath := m.path
		if rel != "." {
			pkgPath = path.Join(m.path, filepath.ToSlash(rel))
		}
		pl, err := packageAPI(p, pkgPath)
		if err != nil {
			return err
		}
		lines = append(lines, pl...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

// packageAPI returns the API lines of the package in dir, none for a
// directory without Go files or with a main package.
func packageAPI(dir, pkgPath string) ([]string, error) {
	bp, err := build.Default.ImportDir(dir, 0)
	if err != nil {
		if _, ok := err.(*build.NoGoError); ok {
			return nil, nil
		}
		return nil, err
	}
	if bp.Name == "main" {
		return nil, nil
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	// Type-checked without its imports, the package still has the values
	// of the constants that depend on its own constants alone.
	conf := types.Config{Importer: noImports{}, Error: func(error) {}}
	pkg, _ := conf.Check(pkgPath, fset, files, nil)
	var out []string
	emit := func(format string, args ...any) {
		out = append(out, "pkg "+pkgPath+", "+fmt.Sprintf(format, args...))
	}
	for _, f := range files {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				funcLines(d, emit)
			case *ast.GenDecl:
				genLines(d, pkg, emit)
			}
		}
	}
	return out, nil
}

// noImports imports nothing: apicheck reads a package's own files only.
type noImports struct{}

func (noImports) Import(path string) (*types.Package, error) {
	return nil, fmt.Errorf("%s not read", path)
}

// constValue returns the value of the package-level constant name, or ""
// when it is not known without the package's imports.
func constValue(pkg *types.Package, name string) string {
	if pkg == nil {
		return ""
	}
	c, ok := pkg.Scope().Lookup(name).(*types.Const)
	if !ok || c.Val().Kind() == constant.Unknown {
		return ""
	}
	return c.Val().ExactString()
}

func funcLines(d *ast.FuncDecl, emit func(string, ...any)) {
	if !d.Name.IsExported() {
		return
	}
	if d.Recv == nil {
		emit("func %s%s%s", d.Name.Name, typeParams(d.Type.TypeParams), signature(d.Type))
		return
	}
	if len(d.Recv.List) == 0 {
		return
	}
	recv := d.Recv.List[0].Type
	star := ""
	if s, ok := recv.(*ast.StarExpr); ok {
		star, recv = "*", s.X
	}
	switch r := recv.(type) {
	case *ast.IndexExpr:
		recv = r.X
	case *ast.IndexListExpr:
		recv = r.X
	}
	id, ok := recv.(*ast.Ident)
	if !ok || !id.IsExported() {
		return
	}
	emit("method (%s%s) %s%s", star, id.Name, d.Name.Name, signature(d.Type))
}

func genLines(d *ast.GenDecl, pkg *types.Package, emit func(string, ...any)) {
	switch d.Tok {
	case token.TYPE:
		for _, s := range d.Specs {
			typeLines(s.(*ast.TypeSpec), emit)
		}
	case token.CONST:
		// Inside a group, a spec without values repeats the last type and
		// values, with iota its index in the group.
		var lastType ast.Expr
		var lastValues []ast.Expr
		for iota, s := range d.Specs {
			vs := s.(*ast.ValueSpec)
			if len(vs.Values) > 0 {
				lastType, lastValues = vs.Type, vs.Values
			}
			for i, n := range vs.Names {
				if !n.IsExported() {
					continue
				}
				line := "const " + n.Name
				if lastType != nil {
					line += " " + typeString(lastType)
				}
				if v := constValue(pkg, n.Name); v != "" {
					line += " = " + v
				} else if i < len(lastValues) {
					line += " = " + types.ExprString(lastValues[i])
					if usesIota(lastValues[i]) {
						line += fmt.Sprintf(" (iota %d)", iota)
					}
				}
				emit("%s", line)
			}
		}
	case token.VAR:
		for _, s := range d.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !n.IsExported() {
					continue
				}
				switch {
				case vs.Type != nil:
					emit("var %s %s", n.Name, typeString(vs.Type))
				case i < len(vs.Values) && (isErrorCall(vs.Values[i]) || strings.HasPrefix(n.Name, "Err")):
					emit("var %s error", n.Name)
				case i < len(vs.Values):
					emit("var %s = %s", n.Name, types.ExprString(vs.Values[i]))
				default:
					emit("var %s", n.Name)
				}
			}
		}
	}
}

func typeLines(ts *ast.TypeSpec, emit func(string, ...any)) {
	if !ts.Name.IsExported() {
		return
	}
	name := ts.Name.Name + typeParams(ts.TypeParams)
	if ts.Assign.IsValid() {
		emit("type %s = %s", name, typeString(ts.Type))
		return
	}
	switch t := ts.Type.(type) {
	case *ast.StructType:
		emit("type %s struct", name)
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				if embeddedName(f.Type).IsExported() {
					emit("type %s struct, embedded %s", name, typeString(f.Type))
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					emit("type %s struct, %s %s", name, n.Name, typeString(f.Type))
				}
			}
		}
	case *ast.InterfaceType:
		emit("type %s interface { %s }", name, strings.Join(interfaceMembers(t), ", "))
		for _, f := range t.Methods.List {
			if len(f.Names) == 0 {
				emit("type %s interface, embedded %s", name, typeString(f.Type))
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					emit("type %s interface, %s%s", name, n.Name, signature(f.Type.(*ast.FuncType)))
				}
			}
		}
	default:
		emit("type %s %s", name, typeString(ts.Type))
	}
}

// interfaceMembers lists an interface's method names and embedded types,
// exported or not (an unexported method keeps others from implementing it).
func interfaceMembers(t *ast.InterfaceType) []string {
	var m []string
	for _, f := range t.Methods.List {
		if len(f.Names) == 0 {
			m = append(m, typeString(f.Type))
			continue
		}
		for _, n := range f.Names {
			m = append(m, n.Name)
		}
	}
	slices.Sort(m)
	return m
}

func embeddedName(e ast.Expr) *ast.Ident {
	switch t := e.(type) {
	case *ast.StarExpr:
		return embeddedName(t.X)
	case *ast.SelectorExpr:
		return t.Sel
	case *ast.IndexExpr:
		return embeddedName(t.X)
	case *ast.IndexListExpr:
		return embeddedName(t.X)
	case *ast.Ident:
		return t
	}
	return ast.NewIdent("_")
}

func usesIota(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == "iota" {
			found = true
		}
		return !found
	})
	return found
}

func isErrorCall(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	s := types.ExprString(c.Fun)
	return s == "errors.New" || s == "fmt.Errorf"
}

// typeParams formats a type parameter list, [] with names, as they are
// referred to in the signature.
func typeParams(fl *ast.FieldList) string {
	if fl == nil || len(fl.List) == 0 {
		return ""
	}
	var parts []string
	for _, f := range fl.List {
		names := make([]string, len(f.Names))
		for i, n := range f.Names {
			names[i] = n.Name
		}
		parts = append(parts, strings.Join(names, ", ")+" "+typeString(f.Type))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// signature formats a function type's parameters and results without
// their names.
func signature(ft *ast.FuncType) string {
	s := "(" + strings.Join(fieldTypes(ft.Params), ", ") + ")"
	results := fieldTypes(ft.Results)
	switch len(results) {
	case 0:
	case 1:
		s += " " + results[0]
	default:
		s += " (" + strings.Join(results, ", ") + ")"
	}
	return s
}

func fieldTypes(fl *ast.FieldList) []string {
	if fl == nil {
		return nil
	}
	var out []string
	for _, f := range fl.List {
		t := typeString(f.Type)
		n := max(len(f.Names), 1)
		for range n {
			out = append(out, t)
		}
	}
	return out
}

// typeString formats a type expression on one line, function types
// without parameter names.
func typeString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.FuncType:
		return "func" + signature(t)
	case *ast.StarExpr:
		return "*" + typeString(t.X)
	case *ast.ArrayType:
		if t.Len == nil {
			return "[]" + typeString(t.Elt)
		}
		return "[" + types.ExprString(t.Len) + "]" + typeString(t.Elt)
	case *ast.MapType:
		return "map[" + typeString(t.Key) + "]" + typeString(t.Value)
	case *ast.Ellipsis:
		return "..." + typeString(t.Elt)
	case *ast.ChanType:
		switch t.Dir {
		case ast.SEND:
			return "chan<- " + typeString(t.Value)
		case ast.RECV:
			return "<-chan " + typeString(t.Value)
		}
		return "chan " + typeString(t.Value)
	}
	return types.ExprString(e)
}
