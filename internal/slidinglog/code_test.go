package slidinglog

import (
	"os"
	"strings"
	"testing"

	"github.com/slidinglog/ratelimit/internal/luasource"
)

// testCode is the library as the repository holds it: the tests read
// lua/ from disk, where package lua embeds it.
var testCode = func() *Code {
	c, err := Load(os.DirFS("../../lua"))
	if err != nil {
		panic(err)
	}
	return c
}()

// TestLoad: the library is built from every file of Files, in turn, and
// named by their hash; a missing file is an error, not a library without
// it.
func TestLoad(t *testing.T) {
	if !strings.HasPrefix(testCode.LibraryName(), "ratelimit_") || len(testCode.LibraryName()) != len("ratelimit_")+12 {
		t.Errorf("library name %q, want ratelimit_ and 12 hex digits", testCode.LibraryName())
	}
	at := -1
	for _, f := range Files {
		b, err := os.ReadFile("../../lua/" + f)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(testCode.library, string(b))
		if i <= at {
			t.Errorf("%s is not in the library after the files before it (at %d, previous at %d)", f, i, at)
		}
		at = i
	}
	if _, err := Load(os.DirFS(t.TempDir())); err == nil {
		t.Error("Load of a directory without the library's files: no error")
	}
}

// TestLibraryName: the library the store loads (Default, embedded) is the
// one on disk, and luasource.Name (redisstore.LibraryName) names it.
func TestLibraryName(t *testing.T) {
	if got, want := Default.LibraryName(), testCode.LibraryName(); got != want {
		t.Errorf("the embedded library is %s, the one on disk %s", got, want)
	}
	if got, want := luasource.Name(luasource.Embedded()), Default.LibraryName(); got != want {
		t.Errorf("luasource.Name() = %s, the library loaded is %s", got, want)
	}
}
