package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash"

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
// parsed and written again.
func digestCanonical(kind string, targets []Target, canonOp json.RawMessage) (string, error) {
	var d requestDigester
	return d.digest(kind, targets, canonOp)
}

// requestDigester digests requests of one kind and operation (a fan-out's
// children: one document for each of thousands of nodes). SHA-256 reads
// its input in order, and the targets come last in the canonical form, so
// the hash of what precedes them is made once and copied for each
// request: 10,000 children of a 250 KB document hashed 2.5 GB, 1.4 s of
// the fan-out's first transaction (BENCHMARKS.md, forty-second sitting).
// The zero value is ready; it keeps the last kind and operation asked.
type requestDigester struct {
	kind   string
	op     json.RawMessage
	prefix hash.Cloner // the hash of {"kind":…,"operation":…,"targets":
}

func (d *requestDigester) digest(kind string, targets []Target, canonOp json.RawMessage) (string, error) {
	if targets == nil {
		targets = []Target{}
	}
	if len(canonOp) == 0 {
		canonOp = json.RawMessage("{}")
	}
	t, err := canonicalOf(targets)
	if err != nil {
		return "", err
	}
	h, err := d.start(kind, canonOp)
	if err != nil {
		return "", err
	}
	h.Write(t)
	h.Write([]byte(`}`))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// start answers a hash that has read a request's canonical form up to
// its targets.
func (d *requestDigester) start(kind string, canonOp json.RawMessage) (hash.Hash, error) {
	if d.prefix != nil && d.kind == kind && sameBytes(d.op, canonOp) {
		return d.prefix.Clone()
	}
	k, err := canonicalOf(kind)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(`{"kind":`), k, []byte(`,"operation":`), canonOp, []byte(`,"targets":`)} {
		h.Write(part)
	}
	c, ok := h.(hash.Cloner)
	if !ok {
		// A build whose hashes cannot be copied (GOFIPS140=v1.0.0)
		// hashes each request whole.
		return h, nil
	}
	d.kind, d.op, d.prefix = kind, canonOp, c
	return c.Clone()
}

// sameBytes reports whether a and b are equal, at once when they are one
// copy.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0] || bytes.Equal(a, b))
}

// canonicalOf answers v's JSON in canonical form.
func canonicalOf(v any) (json.RawMessage, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return Canonical(raw)
}
