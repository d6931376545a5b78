package kvblock

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOneHashSource enforces that block hashes have one source: no package
// but this one imports the hash function, so the engine's prefix cache and
// the router's KV index always derive identical hashes for the same tokens.
// The tokenizer's caches key text (not blocks) with the same function and
// are the one exception.
func TestOneHashSource(t *testing.T) {
	allowed := map[string]bool{"../../engine/kvblock": true, "../../router/tokenize": true}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "xxh3") && !allowed[filepath.ToSlash(filepath.Dir(path))] {
				t.Errorf("%s imports %s: hash blocks with package kvblock instead", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
