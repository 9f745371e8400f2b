// Command server is the Nodeward control plane: `go run ./server` serves the
// API, the agent endpoints and the console on an embedded SQLite database.
// All wiring lives in server/controlplane so tests can start the real server.
package main

import (
	"os"

	"github.com/nodeward/nodeward/server/controlplane"
)

func main() {
	os.Exit(controlplane.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
