//go:build nodeward_testkinds

package testkinds

import (
	"os"

	"github.com/nodeward/nodeward/ledger"
)

// Enabled reports whether this build serves the test kinds.
const Enabled = true

// Register adds the test kinds to r: this build was made with the tag
// nodeward_testkinds. Runs are recorded under $NODEWARD_TEST_KINDS_DIR.
func Register(r *ledger.Registry, replica string) {
	for _, k := range Kinds(replica, os.Getenv(EnvDir)) {
		r.Register(k)
	}
}
