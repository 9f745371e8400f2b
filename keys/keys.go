// Package keys derives every signing and sealing key from the one master key.
// Each credential family (node enrollment, node sessions, console sessions,
// sealing) gets its own subkey by HKDF-SHA256 with a domain label, so a token
// of one family can never verify as another. A ring holds the current master
// key and older ones kept for verification after a rotation; tokens carry a
// `kid` naming the key that signed them.
package keys

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Domain labels for subkeys. Changing one invalidates every credential of
// that family.
const (
	LabelNodeEnrollment = "nodeward/v1/node-enrollment"
	LabelNodeSession    = "nodeward/v1/node-session"
	LabelConsoleSession = "nodeward/v1/console-session"
	LabelSealing        = "nodeward/v1/sealing"
	// LabelConfigDigest keys the digest that stands for a sealed value in
	// a configuration's hash (secrets.Service.DigestSecret).
	LabelConfigDigest = "nodeward/v1/config-digest"
	// LabelPackageHostToken keys the HMAC that mints package host tokens
	// from their operation (auth: a token is re-derivable, never stored).
	LabelPackageHostToken = "nodeward/v1/package-host-token"
)

// ErrNoKey means the ring has no master key: signing and verification both
// refuse rather than accept everything.
var ErrNoKey = errors.New("no master key configured")

// Ring is the current master key plus previous ones kept for verification.
type Ring struct {
	masters [][]byte // masters[0] signs; all verify
	// derived caches each label's subkeys, one per master in the same
	// order: every session check verifies a token, and deriving its key
	// (HKDF and a digest) each time cost ~1.4 KB of garbage per poll.
	derived sync.Map // label → []Subkey
}

// MinKeyBytes is the shortest master key accepted.
const MinKeyBytes = 32

// ParseRing reads master keys from text: one hex (or raw) key per line, the
// first is current, the rest are previous keys kept for verification. Blank
// lines and lines starting with # are ignored.
func ParseRing(text string) (*Ring, error) {
	var r Ring
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := hex.DecodeString(line)
		if err != nil {
			k = []byte(line)
		}
		if len(k) < MinKeyBytes {
			return nil, fmt.Errorf("master key too short: need at least %d bytes (%d hex characters)", MinKeyBytes, 2*MinKeyBytes)
		}
		r.masters = append(r.masters, k)
	}
	return &r, nil
}

// NewRing returns a ring over the given master keys (first is current).
func NewRing(masters ...[]byte) *Ring {
	return &Ring{masters: masters}
}

// Empty reports whether the ring has no key.
func (r *Ring) Empty() bool { return r == nil || len(r.masters) == 0 }

// Subkey is one derived key with its id.
type Subkey struct {
	ID  string
	Key []byte
}

// Current returns the current subkey for label.
func (r *Ring) Current(label string) (Subkey, error) {
	if r.Empty() {
		return Subkey{}, ErrNoKey
	}
	sks, err := r.subkeys(label)
	if err != nil {
		return Subkey{}, err
	}
	return sks[0], nil
}

// subkeys answers label's subkey under every master key, derived once.
// The ring's keys never change, so neither do these; callers must not
// modify a Subkey's Key.
func (r *Ring) subkeys(label string) ([]Subkey, error) {
	if v, ok := r.derived.Load(label); ok {
		return v.([]Subkey), nil
	}
	sks := make([]Subkey, len(r.masters))
	for i, m := range r.masters {
		var err error
		if sks[i], err = derive(m, label); err != nil {
			return nil, err
		}
	}
	v, _ := r.derived.LoadOrStore(label, sks)
	return v.([]Subkey), nil
}

// Lookup returns the subkey for label whose id is kid, from any master key in
// the ring.
func (r *Ring) Lookup(label, kid string) (Subkey, error) {
	if r.Empty() {
		return Subkey{}, ErrNoKey
	}
	sks, err := r.subkeys(label)
	if err != nil {
		return Subkey{}, err
	}
	for _, sk := range sks {
		if sk.ID == kid {
			return sk, nil
		}
	}
	return Subkey{}, errors.New("unknown key id")
}

func derive(master []byte, label string) (Subkey, error) {
	k, err := hkdf.Key(sha256.New, master, nil, label, 32)
	if err != nil {
		return Subkey{}, err
	}
	// The id is a digest of the derived key: it names the key without
	// revealing anything about it.
	sum := sha256.Sum256(append([]byte("kid:"), k...))
	return Subkey{ID: hex.EncodeToString(sum[:6]), Key: k}, nil
}
