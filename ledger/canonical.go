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
	if len(operation) == 0 {
		operation = json.RawMessage("{}")
	}
	canon, err := Canonical(operation)
	if err != nil {
		return "", err
	}
	return digestCanonical(kind, targets, canon)
}

// digestCanonical is Digest of an operation already in canonical form.
// RFC 8785's form of an object is its members' forms in key order (kind,
// operation, targets), so the operation is written as it is rather than
// parsed and written again: a fan-out digests one document for each of
// thousands of children.
func digestCanonical(kind string, targets []Target, canonOp json.RawMessage) (string, error) {
	if targets == nil {
		targets = []Target{}
	}
	if len(canonOp) == 0 {
		canonOp = json.RawMessage("{}")
	}
	k, err := canonicalOf(kind)
	if err != nil {
		return "", err
	}
	t, err := canonicalOf(targets)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(`{"kind":`), k, []byte(`,"operation":`), canonOp, []byte(`,"targets":`), t, []byte(`}`)} {
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// canonicalOf answers v's JSON in canonical form.
func canonicalOf(v any) (json.RawMessage, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return Canonical(raw)
}
