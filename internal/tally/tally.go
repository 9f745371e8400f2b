// Package tally lets the attack tests count what they tried for the
// reliability report: each refusal a test provokes is one line appended to
// the file named by NODEWARD_TORTURE_TALLY, which `make torture` sets and
// reads (cmd/torture). Without it Record does nothing, so an ordinary
// `go test` writes nowhere. Tests only; nothing here ships.
package tally

import (
	"encoding/json"
	"os"
	"sync"
)

// EnvFile names the tally file.
const EnvFile = "NODEWARD_TORTURE_TALLY"

// Entry is one input a test tried and how it was answered.
type Entry struct {
	Suite  string `json:"suite"`
	Status int    `json:"status"`
	Code   string `json:"code,omitempty"`
}

var mu sync.Mutex

// Record appends one entry when the tally file is set.
func Record(suite string, status int, code string) {
	path := os.Getenv(EnvFile)
	if path == "" {
		return
	}
	b, _ := json.Marshal(Entry{Suite: suite, Status: status, Code: code})
	mu.Lock()
	defer mu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	_, _ = f.Write(append(b, '\n'))
	_ = f.Close()
}
