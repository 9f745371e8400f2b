// Package layering holds the one test of DECISIONS.md §33's direction:
// domain packages own their types and store interfaces, only models/ knows
// GORM, and handlers call the domain.
package layering

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoPersistenceImports: no file (tests aside) of a domain package or of
// handlers imports GORM or models.
func TestNoPersistenceImports(t *testing.T) {
	for _, dir := range []string{"auth", "fleet", "ledger", "secrets", "handlers"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "no Go files in %s", dir)
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
}
