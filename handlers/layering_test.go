package handlers

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoPersistenceImports keeps DECISIONS.md §33: handlers never touch
// GORM or models: they call the domain packages.
func TestNoPersistenceImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			require.False(t, strings.HasPrefix(path, "gorm.io/") || path == "github.com/nodeward/nodeward/models",
				"%s imports %s", name, path)
		}
	}
}
