package slidinglog

import (
	"os"
	"strings"
	"testing"
)

// testCode is the library as the repository holds it: the tests read
// lua/ from disk, where the root package embeds it.
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
