package secrets

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/keys"
)

// Use is an operation on its way into the ledger that may carry handles.
type Use struct {
	Principal   Principal
	RequestID   string
	OperationID string
	// Target is the operation's target; FanOut operations (fleet.command,
	// fleet.configure) use handles sealed for the fleet instead
	// (DECISIONS.md §17).
	Target    Target
	FanOut    bool
	Operation json.RawMessage
}

// Carries reports whether an operation holds text that looks like a
// handle (the cheap test before Resolve).
func Carries(operation []byte) bool { return bytes.Contains(operation, []byte(HandlePrefix)) }

// Denied is Resolve's refusal: permission_denied, naming no handle. It
// carries the audit row to record once the refused submission has rolled
// back (RecordDenial).
type Denied struct {
	err   *errcode.Error
	audit AuditEntry
}

// Error answers the refusal's message (it names no handle).
func (d *Denied) Error() string { return d.err.Error() }

// Unwrap answers the permission_denied error.
func (d *Denied) Unwrap() error { return d.err }

// Resolve finds every handle in u.Operation and spends it for this
// operation, all or none, inside the submitting transaction tx: each must
// have been sealed by the same principal for this request id, target and
// exactly the JSON pointer where it appears, be unexpired and unused. It
// keeps the values encrypted for delivery beside the operation and
// answers them by pointer. Any other use is a *Denied (permission_denied);
// the caller rolls tx back and calls RecordDenial.
func (s *Service) Resolve(ctx context.Context, tx Tx, u Use) (map[string]string, error) {
	if !Carries(u.Operation) {
		return nil, nil
	}
	found, err := findHandles(u.Operation)
	if err != nil {
		return nil, err
	}
	want := u.Target
	if u.FanOut {
		want = Target{Kind: TargetFleet}
	}
	now := s.clock()
	out := map[string]string{}
	var uses []AuditEntry
	var deliveries []Delivery
	for _, h := range found {
		digest := Digest(h.handle)
		a := AuditEntry{At: now, Action: ActionUse, Outcome: OutcomeDenied, Principal: u.Principal,
			HandleDigest: digest[:16], RequestID: u.RequestID, OperationID: u.OperationID, Target: want, Field: h.pointer}
		deny := func() error {
			return &Denied{err: errcode.Errorf(errcode.PermissionDenied,
				"the sealed value at %s cannot be used by this request: seal it for this request, target and field, and use it once before it expires", h.pointer), audit: a}
		}
		if !wellFormed(h.handle) {
			return nil, deny()
		}
		rec, err := tx.Lookup(ctx, digest)
		if errors.Is(err, ErrNoRows) {
			return nil, deny()
		}
		if err != nil {
			return nil, err
		}
		if rec.Principal != u.Principal || rec.RequestID != u.RequestID || rec.Target != want ||
			rec.Field != h.pointer || rec.State != StateSealed || !now.Before(rec.ExpiresAt) ||
			(rec.Target.Kind == TargetFleet && !u.FanOut) {
			return nil, deny()
		}
		plain, err := s.open(rec.KeyID, rec.Box, sealedAAD(digest))
		if err != nil {
			return nil, deny()
		}
		ok, err := tx.MarkUsed(ctx, digest, u.OperationID, now)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, deny() // a concurrent use won, or the same handle appears twice
		}
		kid, box, err := s.seal(plain, deliveryAAD(u.OperationID, h.pointer))
		if err != nil {
			return nil, err
		}
		deliveries = append(deliveries, Delivery{OperationID: u.OperationID, Field: h.pointer, KeyID: kid, Box: box, CreatedAt: now})
		a.Outcome, a.Target = OutcomeOK, rec.Target
		uses = append(uses, a)
		out[h.pointer] = string(plain)
	}
	if err := tx.InsertDeliveries(ctx, deliveries...); err != nil {
		return nil, err
	}
	if err := tx.InsertAudit(ctx, uses...); err != nil {
		return nil, err
	}
	return out, nil
}

// RecordDenial audits a denial Resolve answered, once the refused
// submission rolled back; other errors are ignored.
func (s *Service) RecordDenial(ctx context.Context, err error) {
	var d *Denied
	if !errors.As(err, &d) {
		return
	}
	if err := s.store.InsertAudit(context.WithoutCancel(ctx), d.audit); err != nil {
		s.log.Warn("audit a denied use of a sealed value", "err", err)
	}
}

// Deliver answers payload with each handle that operation sourceID
// resolved replaced by its value, for the answer to the node that runs it
// and nothing else. A fan-out child's payload is its parent's operation at
// within ("/payload"): its parent is the source, and only values under
// within are delivered, at their place in the child. A payload without
// handles is answered as is, at no read.
func (s *Service) Deliver(ctx context.Context, sourceID, within string, payload json.RawMessage) (json.RawMessage, error) {
	return s.deliver(ctx, s.store, sourceID, within, payload)
}

// deliveryReader reads an operation's deliveries: the Store, or a Tx.
type deliveryReader interface {
	Deliveries(ctx context.Context, operationID string) ([]Delivery, error)
}

// deliver is Deliver and TxDeliver, reading through r.
func (s *Service) deliver(ctx context.Context, r deliveryReader, sourceID, within string, payload json.RawMessage) (json.RawMessage, error) {
	if !Carries(payload) {
		return payload, nil
	}
	ds, err := r.Deliveries(ctx, sourceID)
	if err != nil || len(ds) == 0 {
		return payload, err
	}
	doc, err := decode(payload)
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		if !strings.HasPrefix(d.Field, within+"/") {
			continue
		}
		plain, err := s.open(d.KeyID, d.Box, deliveryAAD(sourceID, d.Field))
		if err != nil {
			return nil, err
		}
		doc, err = replaceAt(doc, splitPointer(strings.TrimPrefix(d.Field, within)), string(plain))
		if err != nil {
			return nil, err
		}
	}
	return json.Marshal(doc)
}

// wellFormed: the prefix and 32 bytes of base64url, nothing else.
func wellFormed(h string) bool {
	b, err := base64.RawURLEncoding.Strict().DecodeString(strings.TrimPrefix(h, HandlePrefix))
	return err == nil && len(b) == 32
}

type foundHandle struct{ pointer, handle string }

func decode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers pass through untouched
	var doc any
	err := dec.Decode(&doc)
	return doc, err
}

// findHandles answers every string of the document that starts with the
// handle prefix, with its JSON pointer, in document order.
func findHandles(b []byte) ([]foundHandle, error) {
	doc, err := decode(b)
	if err != nil {
		return nil, err
	}
	var out []foundHandle
	var walk func(v any, ptr string)
	walk = func(v any, ptr string) {
		switch x := v.(type) {
		case string:
			if strings.HasPrefix(x, HandlePrefix) {
				out = append(out, foundHandle{pointer: ptr, handle: x})
			}
		case []any:
			for i, e := range x {
				walk(e, ptr+"/"+strconv.Itoa(i))
			}
		case map[string]any:
			for k, e := range x {
				walk(e, ptr+"/"+escapeToken(k))
			}
		}
	}
	walk(doc, "")
	return out, nil
}

// ValidPointer reports whether p is a non-empty JSON pointer (RFC 6901):
// "/"-separated tokens in which "~" is only ever "~0" or "~1".
func ValidPointer(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 >= len(p) || (p[i+1] != '0' && p[i+1] != '1')) {
			return false
		}
	}
	return true
}

func escapeToken(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}

func splitPointer(p string) []string {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, t := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return parts
}

// replaceAt sets the string at path inside doc (which must exist).
func replaceAt(doc any, path []string, value string) (any, error) {
	if len(path) == 0 {
		return value, nil
	}
	switch x := doc.(type) {
	case map[string]any:
		v, ok := x[path[0]]
		if !ok {
			return nil, errors.New("sealed field not in the payload")
		}
		nv, err := replaceAt(v, path[1:], value)
		x[path[0]] = nv
		return x, err
	case []any:
		i, err := strconv.Atoi(path[0])
		if err != nil || i < 0 || i >= len(x) {
			return nil, errors.New("sealed field not in the payload")
		}
		x[i], err = replaceAt(x[i], path[1:], value)
		return x, err
	}
	return nil, errors.New("sealed field not in the payload")
}

// StringAt answers the string at the JSON pointer p inside doc.
func StringAt(doc []byte, p string) (string, bool) {
	v, err := decode(doc)
	if err != nil {
		return "", false
	}
	for _, t := range splitPointer(p) {
		switch x := v.(type) {
		case map[string]any:
			if v = x[t]; v == nil {
				return "", false
			}
		case []any:
			i, err := strconv.Atoi(t)
			if err != nil || i < 0 || i >= len(x) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}

// ReplaceAt answers doc with the value at the JSON pointer p (which must
// exist) replaced by the string value.
func ReplaceAt(doc []byte, p, value string) (json.RawMessage, error) {
	v, err := decode(doc)
	if err != nil {
		return nil, err
	}
	if v, err = replaceAt(v, splitPointer(p), value); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// Pointers answers the JSON pointers of the handles doc carries, in
// document order.
func Pointers(doc []byte) ([]string, error) {
	found, err := findHandles(doc)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(found))
	for i, h := range found {
		out[i] = h.pointer
	}
	return out, nil
}

// TxDeliver is Deliver read inside tx: the transaction that resolved the
// handles (a configuration's document is stored with its values as it is
// recorded).
func (s *Service) TxDeliver(ctx context.Context, tx Tx, sourceID, within string, payload json.RawMessage) (json.RawMessage, error) {
	return s.deliver(ctx, tx, sourceID, within, payload)
}

func configAAD(nodeID string, revision int64) []byte {
	return []byte("config\x00" + nodeID + "\x00" + strconv.FormatInt(revision, 10))
}

// SealDocument encrypts a node's configuration document for storage
// (under the sealing key, bound to the node and revision).
func (s *Service) SealDocument(nodeID string, revision int64, plain []byte) (string, []byte, error) {
	return s.seal(plain, configAAD(nodeID, revision))
}

// DigestSecret answers what stands for a sealed value in a configuration
// document's hash: HMAC-SHA256 under a subkey of the master key. Equal
// values digest alike, so an unchanged document keeps its revision, but
// the hash administrators read cannot be used to test guesses of a value
// offline, as a plain SHA-256 over the values could.
func (s *Service) DigestSecret(value string) (string, error) {
	sk, err := s.keys.Current(keys.LabelConfigDigest)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, sk.Key)
	m.Write([]byte(value))
	return "nw-sealed-digest:" + hex.EncodeToString(m.Sum(nil)), nil
}

// OpenDocument decrypts what SealDocument sealed.
func (s *Service) OpenDocument(nodeID string, revision int64, kid string, box []byte) ([]byte, error) {
	return s.open(kid, box, configAAD(nodeID, revision))
}

// A document many nodes are given at once is sealed once, under a data
// key of its own, and each node's row holds that key sealed for the node
// and revision (envelope encryption): the nodes' rows stay small, and a
// row still opens only for its own node and revision, since the key it
// holds is bound to them and to the document's id, and the document to
// its id.

func sharedDocumentAAD(id string) []byte { return []byte("config-document\x00" + id) }

func documentKeyAAD(nodeID string, revision int64, id string) []byte {
	return []byte("config-key\x00" + nodeID + "\x00" + strconv.FormatInt(revision, 10) + "\x00" + id)
}

// SealSharedDocument encrypts a document stored once under id, under a
// fresh data key, answering the key and the sealed document.
func (s *Service) SealSharedDocument(id string, plain []byte) (key, box []byte, err error) {
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, nil, err
	}
	gcm, err := newGCM(key)
	if err != nil {
		return nil, nil, err
	}
	// A fresh key seals one document, so a random nonce never repeats
	// under it.
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, err
	}
	return key, gcm.Seal(nonce, nonce, plain, sharedDocumentAAD(id)), nil
}

// WrapDocumentKey seals a shared document's data key for one node's
// revision (under the sealing key).
func (s *Service) WrapDocumentKey(nodeID string, revision int64, id string, key []byte) (string, []byte, error) {
	return s.seal(key, documentKeyAAD(nodeID, revision, id))
}

// OpenSharedDocument decrypts a shared document through the data key a
// node's row holds (WrapDocumentKey).
func (s *Service) OpenSharedDocument(nodeID string, revision int64, id, kid string, wrapped, box []byte) ([]byte, error) {
	key, err := s.open(kid, wrapped, documentKeyAAD(nodeID, revision, id))
	if err != nil {
		return nil, err
	}
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	if len(box) < gcm.NonceSize() {
		return nil, errors.New("sealed document too short")
	}
	return gcm.Open(nil, box[:gcm.NonceSize()], box[gcm.NonceSize():], sharedDocumentAAD(id))
}
