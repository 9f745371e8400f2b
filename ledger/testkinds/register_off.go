//go:build !nodeward_testkinds

package testkinds

import "github.com/nodeward/nodeward/ledger"

// Enabled reports whether this build serves the test kinds.
const Enabled = false

// Register does nothing: a build without the tag nodeward_testkinds
// serves no test kind.
func Register(*ledger.Registry, string) {}
