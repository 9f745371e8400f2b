package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/go-json-experiment/json/jsontext"
)

// Canonical answers raw in RFC 8785 canonical form (object members sorted,
// numbers and strings in their one canonical spelling, no insignificant
// space), so the same request however formatted has the same digest.
func Canonical(raw json.RawMessage) (json.RawMessage, error) {
	v := jsontext.Value(append([]byte(nil), raw...))
	if err := v.Canonicalize(); err != nil {
		return nil, err
	}
	return json.RawMessage(v), nil
}

// Digest is DECISIONS.md §13's request digest: lowercase hex SHA-256 of the
// canonical JSON of {kind, targets, operation}.
func Digest(kind string, targets []Target, operation json.RawMessage) (string, error) {
	if targets == nil {
		targets = []Target{}
	}
	if len(operation) == 0 {
		operation = json.RawMessage("{}")
	}
	body, err := json.Marshal(struct {
		Kind      string          `json:"kind"`
		Targets   []Target        `json:"targets"`
		Operation json.RawMessage `json:"operation"`
	}{kind, targets, operation})
	if err != nil {
		return "", err
	}
	canon, err := Canonical(body)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}
