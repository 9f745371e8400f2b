package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/secrets"
)

// Desired configuration (ARCHITECTURE.md §2, DECISIONS.md §32): one per
// node, stored with a revision and a hash, delivered level-triggered in the
// long-poll answer while due, and judged against the node's last report.

// Limits of desired configuration.
const (
	// MaxConfigDocumentBytes bounds a document (its canonical JSON).
	MaxConfigDocumentBytes = 256 << 10
	// MaxConfigFormatBytes bounds a format name.
	MaxConfigFormatBytes = 128
	// MaxConfigMessageBytes bounds a report's message; longer is truncated.
	MaxConfigMessageBytes = 4 << 10
)

// Verdicts of a node's last configuration report against its desired
// configuration, computed on read.
const (
	VerdictApplied  = "applied"
	VerdictFailed   = "failed"
	VerdictStale    = "stale"
	VerdictMismatch = "mismatch"
	VerdictNone     = "none"
)

// SealedMask replaces sealed values in administrators' reads.
const SealedMask = "[sealed]"

// NodeConfig is a node's desired configuration and its last report.
// Revision 0 means no desired configuration (the node reported first).
type NodeConfig struct {
	NodeID   string
	Revision int64
	Hash     string
	Format   string
	// KeyID and Box hold the document with its real values: sealed under
	// KeyID, or as plain JSON when KeyID is empty (no sealer configured).
	// A nil Box is the JSON null document (the configuration cleared).
	// With Shared, Box is instead the shared document's data key, sealed
	// under KeyID for this node and revision.
	KeyID string
	Box   []byte
	// Shared, when set, is the sealed document this revision shares with
	// the other nodes a fan-out gave it to (SharedDocument).
	Shared *SharedDocument
	// SealedPointers are the JSON pointers, into the document, of the
	// values that were sealed handles when it was submitted.
	SealedPointers []string
	// EarlierKeyID and EarlierBox hold the sealed values of the revisions
	// this one replaced (earlierSecrets), as KeyID and Box hold the
	// document; a nil EarlierBox is none.
	EarlierKeyID string
	EarlierBox   []byte
	SizeBytes    int64
	UpdatedAt    time.Time
	OperationID  string
	// SubmittedCursor orders the configure that set Revision among all
	// submitted requests (Configure.SubmittedCursor).
	SubmittedCursor int64
	// Settled: the last report names Revision and Hash and is applied, or
	// failed and not forced since. Delivery stops while settled for the
	// fencing token that reported.
	Settled bool
	// Reported is the node's last report (nil: never reported).
	Reported        *ConfigReport
	AppliedRevision int64
	// Lagging is maintained on every write: reported at least once and
	// AppliedRevision < Revision.
	Lagging           bool
	DeliveredFencing  *int64
	DeliveredRevision *int64
	DeliveredAt       *time.Time
}

// ConfigReport is a node's last configuration report as stored.
type ConfigReport struct {
	Revision   int64
	Hash       string
	State      string
	Message    string
	ObservedAt time.Time
	// Fencing is the session's fencing token when it reported.
	Fencing int64
}

// Verdict judges the last report against the desired configuration.
func (c NodeConfig) Verdict() string {
	r := c.Reported
	switch {
	case r == nil:
		return VerdictNone
	case c.Revision > 0 && r.Revision == c.Revision && r.Hash == c.Hash:
		if r.State == api.ConfigApplied {
			return VerdictApplied
		}
		return VerdictFailed
	case c.Revision > 0 && r.Revision < c.Revision:
		return VerdictStale
	default:
		return VerdictMismatch
	}
}

// dueFor reports whether the configuration is due for a session of that
// fencing token (the store's DueWork computes the same in SQL).
func (c NodeConfig) dueFor(fencing int64) bool {
	if c.Revision == 0 {
		return false
	}
	return !c.Settled || c.Reported == nil || c.Reported.Fencing != fencing
}

func (c *NodeConfig) setLagging() {
	c.Lagging = c.Reported != nil && c.AppliedRevision < c.Revision
}

// SharedDocument is a configuration document stored once for every node
// a fan-out's recording transaction gave it to, sealed under a data key
// of its own that each node's row holds sealed for that node and
// revision. A node's sealed copy of a 256 KiB document is 340 KB of
// base64: 10,000 of them made a wave's recordings and deliveries write
// and read gigabytes (BENCHMARKS.md, forty-second sitting).
type SharedDocument struct {
	// ID names the document: random, never reused.
	ID string
	// Box is the document sealed under its data key (nil in a row read
	// without its document).
	Box []byte
}

// sharedDocumentMin is the size from which a fan-out's nodes share their
// document: below it a node's own sealed copy costs about what the
// shared row and the wrapped key would.
const sharedDocumentMin = 1 << 10

// DocumentSealer keeps configuration documents encrypted at rest (the
// secrets service, under the sealing key).
type DocumentSealer interface {
	SealDocument(nodeID string, revision int64, plain []byte) (kid string, box []byte, err error)
	OpenDocument(nodeID string, revision int64, kid string, box []byte) ([]byte, error)
	// SealSharedDocument seals a document stored once as id under a fresh
	// data key; WrapDocumentKey seals that key for one node's revision;
	// OpenSharedDocument opens the document through a node's wrapped key.
	SealSharedDocument(id string, plain []byte) (key, box []byte, err error)
	WrapDocumentKey(nodeID string, revision int64, id string, key []byte) (kid string, wrapped []byte, err error)
	OpenSharedDocument(nodeID string, revision int64, id, kid string, wrapped, box []byte) ([]byte, error)
	// DigestSecret answers the keyed digest that stands for a sealed
	// value in the document's hash.
	DigestSecret(value string) (string, error)
}

// UseDocumentSealer sets the sealer of configuration documents (wiring
// calls it once, before serving).
func (s *Service) UseDocumentSealer(d DocumentSealer) { s.sealer = d }

// ConfigHash is DECISIONS.md §32's hash: lowercase hex SHA-256 of the RFC
// 8785 canonical JSON of {"format": …, "document": …}.
func ConfigHash(format string, document json.RawMessage) (string, error) {
	if len(document) == 0 {
		document = json.RawMessage("null")
	}
	body, err := json.Marshal(struct {
		Format   string          `json:"format"`
		Document json.RawMessage `json:"document"`
	}{format, document})
	if err != nil {
		return "", err
	}
	v := jsontext.Value(body)
	if err := v.Canonicalize(); err != nil {
		return "", err
	}
	sum := sha256.Sum256(v)
	return hex.EncodeToString(sum[:]), nil
}

// hashedForm answers the document as its hash covers it: each sealed
// value replaced by its keyed digest (DocumentSealer.DigestSecret), so the
// hash stays the same for the same values without exposing them to
// offline guessing.
func (s *Service) hashedForm(doc json.RawMessage, sealed []string) (json.RawMessage, error) {
	if len(sealed) == 0 || s.sealer == nil {
		return doc, nil
	}
	out := doc
	for _, p := range sealed {
		v, ok := secrets.StringAt(doc, p)
		if !ok {
			return nil, fmt.Errorf("fleet: sealed pointer %q names no string in the document", p)
		}
		d, err := s.sealer.DigestSecret(v)
		if err != nil {
			return nil, err
		}
		if out, err = secrets.ReplaceAt(out, p, d); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// CanonicalDocument answers a document in RFC 8785 canonical form; an
// absent document is JSON null.
func CanonicalDocument(document json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(document)) == 0 {
		return json.RawMessage("null"), nil
	}
	v := jsontext.Value(append([]byte(nil), document...))
	if err := v.Canonicalize(); err != nil {
		return nil, err
	}
	return json.RawMessage(v), nil
}

// ValidateConfigFormat checks a format name: 1-128 printable ASCII
// characters without spaces, and no sealed handle.
func ValidateConfigFormat(v *errcode.Validation, field, format string) {
	ok := format != "" && len(format) <= MaxConfigFormatBytes && !strings.HasPrefix(format, secrets.HandlePrefix)
	for i := 0; ok && i < len(format); i++ {
		ok = format[i] > 0x20 && format[i] < 0x7f
	}
	v.Check(ok, field, "required: 1-%d printable characters without spaces (e.g. nginx.site/v1)", MaxConfigFormatBytes)
}

// Configure is a request to set a node's desired configuration.
type Configure struct {
	NodeID      string
	OperationID string
	Format      string
	// Document is the document with its real values (sealed handles
	// already resolved); nil or JSON null clears the configuration.
	Document json.RawMessage
	// SealedPointers name the document's values that were sealed.
	SealedPointers []string
	Force          bool
	// SubmittedCursor is the ledger cursor of the request that asked for
	// this configuration (a fan-out child's is its parent's): a configure
	// recorded after one submitted later (a held fleet.configure child,
	// one re-run after a restart) does not replace it. 0 orders nothing.
	SubmittedCursor int64
}

// ConfigureOutcome is what ConfigureTx did.
type ConfigureOutcome struct {
	Revision int64  `json:"revision"`
	Hash     string `json:"hash"`
	// Changed: a new revision was written (the hash changed).
	Changed bool `json:"changed"`
	// Applied: the revision is applied already (the operation ends at
	// once, succeeded).
	Applied bool `json:"applied"`
	// Failed: the node reported failed for this unchanged revision and the
	// request did not force it again (the operation ends at once, failed,
	// with Message).
	Failed  bool   `json:"failed,omitempty"`
	Message string `json:"-"`
	// Superseded: a configure submitted after this one set the current
	// revision already; nothing was written (the operation ends at once,
	// failed superseded, with Message).
	Superseded bool `json:"superseded,omitempty"`
	// Delivered: the unchanged revision was already delivered to the
	// node's current enrollment and awaits its report (the operation is
	// running at once: its channel has it).
	Delivered bool `json:"-"`
}

// ConfigEnd is how the operations waiting on a node's configuration end.
type ConfigEnd struct {
	State     string // succeeded or failed (the ledger's states)
	Code      string
	Message   string
	Retryable bool
	Result    json.RawMessage
	At        time.Time
}

// ConfigureTx sets a node's desired configuration inside the ledger's
// submitting transaction. The node's row is locked first, so concurrent
// configures of one node serialize: the revision grows by exactly one when
// the hash changes and an unchanged document writes nothing (force on an
// unchanged document makes it due again). A new revision ends the node's
// other open configure operations failed superseded and wakes its
// long-poll. Errors: validation_failed, ErrNotFound, ErrNodeRetired.
func (s *Service) ConfigureTx(ctx context.Context, tx Tx, in Configure) (ConfigureOutcome, error) {
	doc, err := s.checkDocument(in)
	if err != nil {
		return ConfigureOutcome{}, err
	}
	n, err := tx.LockNode(ctx, in.NodeID)
	if isNoRows(err) {
		return ConfigureOutcome{}, ErrNotFound
	}
	if err != nil {
		return ConfigureOutcome{}, err
	}
	if n.State == StateRetired {
		return ConfigureOutcome{}, ErrNodeRetired
	}
	cur, err := tx.LockNodeConfig(ctx, n.ID)
	if isNoRows(err) {
		cur, err = NodeConfig{NodeID: n.ID}, nil
	}
	if err != nil {
		return ConfigureOutcome{}, err
	}
	plan, err := s.planConfigure(n, cur, in, doc)
	if err != nil || plan.save == nil {
		return plan.out, err
	}
	if err := tx.SaveNodeConfig(ctx, *plan.save); err != nil {
		return ConfigureOutcome{}, err
	}
	if plan.supersede != nil {
		if _, err := tx.EndConfigureOperations(ctx, n.ID, in.OperationID, *plan.supersede); err != nil {
			return ConfigureOutcome{}, err
		}
	}
	return plan.out, s.configured(ctx, tx, plan)
}

// ConfigureManyTx is ConfigureTx for many nodes at once (a fan-out's
// release of its node.configure children), in a few statements whatever
// their number: their nodes and configuration rows are locked in node id
// order, each in one statement, the new revisions written in one, and the
// open configure operations they supersede found in one. A node must not
// appear twice. admit runs under those locks with the indexes that passed
// the checks of ConfigureTx (and the node's config.v1 capability), and may
// refuse more. It answers each configure's outcome, or the refusal that
// left it unrecorded (nothing is written for a refused one).
func (s *Service) ConfigureManyTx(ctx context.Context, tx Tx, ins []Configure,
	admit func(ok []int) (map[int]error, error)) ([]ConfigureOutcome, []error, error) {
	outs := make([]ConfigureOutcome, len(ins))
	refused := make([]error, len(ins))
	docs := make([]checkedDocument, len(ins))
	for i, in := range ins {
		// A fan-out's children carry one document: it is made canonical
		// and hashed once, not once a node (hashing a 250 KB document
		// alone took 3.6 ms; BENCHMARKS.md, thirty-ninth sitting).
		if i > 0 && sameDocument(ins[i-1], in) {
			docs[i], refused[i] = docs[i-1], refused[i-1]
			continue
		}
		var err error
		var coded *errcode.Error
		if docs[i], err = s.checkDocument(in); err != nil && !errors.As(err, &coded) {
			return nil, nil, err
		}
		docs[i].shared = &sharedSeal{}
		refused[i] = err
	}
	nodes, ok, err := lockForMany(ctx, tx, refused, func(i int) string { return ins[i].NodeID }, func(_ int, n Node) error {
		if n.State == StateRetired {
			return ErrNodeRetired
		}
		if caps, known := n.Capabilities(); !hasCapability(caps, known, api.CapConfig) {
			return CapabilityMissing(n.ID, api.CapConfig)
		}
		return nil
	})
	if err != nil || len(ok) == 0 {
		return outs, refused, err
	}
	present := make([]string, len(ok))
	for j, i := range ok {
		present[j] = ins[i].NodeID
	}
	configs, err := tx.LockNodeConfigs(ctx, present)
	if err != nil {
		return nil, nil, err
	}
	more, err := admit(ok)
	if err != nil {
		return nil, nil, err
	}
	var plans []configurePlan
	var saves []NodeConfig
	supersedes := map[string]ConfigEnd{}
	var except []string
	for _, i := range ok {
		if refused[i] = more[i]; refused[i] != nil {
			continue
		}
		in := ins[i]
		cur, found := configs[in.NodeID]
		if !found {
			cur = NodeConfig{NodeID: in.NodeID}
		}
		plan, err := s.planConfigure(nodes[in.NodeID], cur, in, docs[i])
		if err != nil {
			var coded *errcode.Error
			if errors.As(err, &coded) {
				refused[i] = err
				continue
			}
			return nil, nil, err
		}
		outs[i] = plan.out
		if plan.save == nil {
			continue
		}
		saves = append(saves, *plan.save)
		plans = append(plans, plan)
		if plan.supersede != nil {
			supersedes[in.NodeID] = *plan.supersede
			except = append(except, in.OperationID)
		}
	}
	// The documents sealed for this call's new revisions (a forced,
	// unchanged one names a document stored already).
	var shared []SharedDocument
	for i, d := range docs {
		if d.shared != nil && d.shared.doc.ID != "" && (i == 0 || docs[i-1].shared != d.shared) {
			shared = append(shared, d.shared.doc)
		}
	}
	if err := tx.SaveConfigDocuments(ctx, shared); err != nil {
		return nil, nil, err
	}
	if err := tx.SaveNodeConfigs(ctx, saves); err != nil {
		return nil, nil, err
	}
	if len(supersedes) > 0 {
		if _, err := tx.EndConfigureOperationsOf(ctx, supersedes, except); err != nil {
			return nil, nil, err
		}
	}
	for _, plan := range plans {
		if err := s.configured(ctx, tx, plan); err != nil {
			return nil, nil, err
		}
	}
	return outs, refused, nil
}

// checkConfigureInput validates a configure's format and document and
// answers the document's canonical form.
func checkConfigureInput(in Configure) ([]byte, error) {
	var v errcode.Validation
	ValidateConfigFormat(&v, "operation/format", in.Format)
	doc, err := CanonicalDocument(in.Document)
	v.Check(err == nil, "operation/document", "must be JSON")
	v.Check(len(doc) <= MaxConfigDocumentBytes, "operation/document", "at most 256 KiB")
	return doc, v.Err()
}

// checkedDocument is a configure's document as it is stored (canonical)
// and its hash; shared, when set, is the sealed copy the nodes recorded
// with it in one transaction share.
type checkedDocument struct {
	doc    []byte
	hash   string
	shared *sharedSeal
}

// sharedSeal is a document sealed once for many nodes: sealed when a
// first node's new revision needs it.
type sharedSeal struct {
	doc SharedDocument
	key []byte
}

// seal seals the document under a fresh id and data key the first time
// it is called; later calls keep what the first made.
func (sh *sharedSeal) seal(sealer DocumentSealer, plain []byte) error {
	if sh.doc.ID != "" {
		return nil
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	id := hex.EncodeToString(raw)
	key, box, err := sealer.SealSharedDocument(id, plain)
	if err != nil {
		return err
	}
	sh.doc, sh.key = SharedDocument{ID: id, Box: box}, key
	return nil
}

// checkDocument validates a configure's format and document (422
// validation_failed) and answers the document's canonical form and hash.
func (s *Service) checkDocument(in Configure) (checkedDocument, error) {
	doc, err := checkConfigureInput(in)
	if err != nil {
		return checkedDocument{}, err
	}
	hashed, err := s.hashedForm(doc, in.SealedPointers)
	if err != nil {
		return checkedDocument{}, err
	}
	hash, err := ConfigHash(in.Format, hashed)
	return checkedDocument{doc: doc, hash: hash}, err
}

// sameDocument reports whether two configures ask for the same document.
func sameDocument(a, b Configure) bool {
	return a.Format == b.Format && bytes.Equal(a.Document, b.Document) && slices.Equal(a.SealedPointers, b.SealedPointers)
}

// configurePlan is what one configure does to its node's row: the
// outcome, the row to write (nil: nothing), and how the node's other open
// configure operations end (nil: they stay).
type configurePlan struct {
	out       ConfigureOutcome
	save      *NodeConfig
	supersede *ConfigEnd
}

// planConfigure decides a configure of node n, whose configuration row
// (locked) is cur, and builds its new row; it writes nothing.
func (s *Service) planConfigure(n Node, cur NodeConfig, in Configure, checked checkedDocument) (configurePlan, error) {
	doc, hash := checked.doc, checked.hash
	now := s.clock()
	var err error
	if cur.Revision > 0 && cur.Hash == hash {
		out := ConfigureOutcome{Revision: cur.Revision, Hash: hash}
		r := cur.Reported
		named := r != nil && r.Revision == cur.Revision && r.Hash == hash
		switch {
		case named && r.State == api.ConfigApplied:
			out.Applied = true
		case named && r.State == api.ConfigFailed && !in.Force:
			out.Failed, out.Message = true, r.Message
		case in.Force && cur.Settled:
			// Asked again: due again at once, whatever the last report
			// said and however recently it was delivered.
			cur.Settled, cur.DeliveredRevision, cur.DeliveredAt = false, nil, nil
			return configurePlan{out: out, save: &cur}, nil
		case !cur.Settled && cur.DeliveredRevision != nil && *cur.DeliveredRevision == cur.Revision &&
			cur.DeliveredFencing != nil && *cur.DeliveredFencing == n.FencingToken:
			out.Delivered = true
		}
		return configurePlan{out: out}, nil
	}
	if in.SubmittedCursor > 0 && in.SubmittedCursor < cur.SubmittedCursor {
		// Last submitted wins, not last recorded: a fleet.configure child
		// released late must not undo a node.configure the operator
		// submitted after the fan-out.
		return configurePlan{out: ConfigureOutcome{Revision: cur.Revision, Hash: cur.Hash, Superseded: true,
			Message: "a configuration submitted after this one (operation " + cur.OperationID + ") set revision " +
				strconv.FormatInt(cur.Revision, 10) + " first"}}, nil
	}
	next := cur
	next.Revision, next.Hash, next.Format = cur.Revision+1, hash, in.Format
	next.SubmittedCursor = max(in.SubmittedCursor, cur.SubmittedCursor)
	next.SizeBytes, next.UpdatedAt, next.OperationID = int64(len(doc)), now, in.OperationID
	next.SealedPointers, next.Settled = in.SealedPointers, false
	if next.EarlierKeyID, next.EarlierBox, err = s.carryEarlierSecrets(cur); err != nil {
		return configurePlan{}, err
	}
	next.KeyID, next.Box, next.Shared = "", nil, nil
	switch {
	case string(doc) == "null":
	case s.sealer == nil:
		next.Box = doc
	case checked.shared != nil && len(doc) >= sharedDocumentMin:
		sh := checked.shared
		if err := sh.seal(s.sealer, doc); err != nil {
			return configurePlan{}, err
		}
		if next.KeyID, next.Box, err = s.sealer.WrapDocumentKey(n.ID, next.Revision, sh.doc.ID, sh.key); err != nil {
			return configurePlan{}, err
		}
		next.Shared = &sh.doc
	default:
		if next.KeyID, next.Box, err = s.sealer.SealDocument(n.ID, next.Revision, doc); err != nil {
			return configurePlan{}, err
		}
	}
	next.setLagging()
	return configurePlan{out: ConfigureOutcome{Revision: next.Revision, Hash: hash, Changed: true}, save: &next,
		supersede: &ConfigEnd{State: "failed", Code: "superseded",
			Message: "a later configuration replaced revision " + strconv.FormatInt(cur.Revision, 10) + " before the node applied it", At: now}}, nil
}

// configured counts a configure's new revision and wakes its node's
// long-poll once its row is written.
func (s *Service) configured(ctx context.Context, tx Tx, plan configurePlan) error {
	if plan.out.Changed {
		s.metrics.ConfigRevisions.Inc()
	}
	return tx.Notify(ctx, Notification{Kind: NotifyCommands, NodeID: plan.save.NodeID})
}

// document answers c's document with its real values (JSON null when
// cleared).
func (s *Service) document(c NodeConfig) (json.RawMessage, error) {
	if c.Box == nil {
		return json.RawMessage("null"), nil
	}
	if c.KeyID == "" {
		return json.RawMessage(c.Box), nil
	}
	if s.sealer == nil {
		return nil, errcode.New(errcode.Internal, "configuration document sealed but no sealer configured")
	}
	if c.Shared != nil {
		if c.Shared.Box == nil {
			return nil, fmt.Errorf("fleet: node %s's configuration read without its shared document %s", c.NodeID, c.Shared.ID)
		}
		plain, err := s.sealer.OpenSharedDocument(c.NodeID, c.Revision, c.Shared.ID, c.KeyID, c.Box, c.Shared.Box)
		return json.RawMessage(plain), err
	}
	plain, err := s.sealer.OpenDocument(c.NodeID, c.Revision, c.KeyID, c.Box)
	return json.RawMessage(plain), err
}

// sealedValues answers the real values of c's sealed fields.
func (s *Service) sealedValues(c NodeConfig) ([]string, error) {
	if len(c.SealedPointers) == 0 || c.Revision == 0 {
		return nil, nil
	}
	doc, err := s.document(c)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range c.SealedPointers {
		if v, ok := secrets.StringAt(doc, p); ok {
			out = append(out, v)
		}
	}
	return out, nil
}

// maxEarlierRevisions bounds the replaced revisions whose sealed values
// a configuration keeps for scrubbing reports: a node reports on the
// revision it was applying, rarely more than one or two behind.
const maxEarlierRevisions = 16

// earlierSecrets are the sealed values of one replaced revision.
type earlierSecrets struct {
	Revision int64    `json:"revision"`
	Values   []string `json:"values"`
}

// earlierRevision is the revision the earlier secrets' box is bound to:
// 0, which no document has (revisions start at 1).
const earlierRevision = 0

// earlierValues answers the sealed values of the revisions c replaced.
func (s *Service) earlierValues(c NodeConfig) ([]earlierSecrets, error) {
	if c.EarlierBox == nil {
		return nil, nil
	}
	plain := c.EarlierBox
	if c.EarlierKeyID != "" {
		if s.sealer == nil {
			return nil, errcode.New(errcode.Internal, "earlier configuration values sealed but no sealer configured")
		}
		var err error
		if plain, err = s.sealer.OpenDocument(c.NodeID, earlierRevision, c.EarlierKeyID, c.EarlierBox); err != nil {
			return nil, err
		}
	}
	var out []earlierSecrets
	return out, json.Unmarshal(plain, &out)
}

// carryEarlierSecrets answers the earlier values the revision replacing
// cur keeps: cur's own sealed values added to those cur kept, the last
// maxEarlierRevisions revisions that had any, sealed again.
func (s *Service) carryEarlierSecrets(cur NodeConfig) (kid string, box []byte, err error) {
	values, err := s.sealedValues(cur)
	if err != nil || len(values) == 0 {
		return cur.EarlierKeyID, cur.EarlierBox, err
	}
	earlier, err := s.earlierValues(cur)
	if err != nil {
		return "", nil, err
	}
	earlier = append(earlier, earlierSecrets{Revision: cur.Revision, Values: values})
	if len(earlier) > maxEarlierRevisions {
		earlier = earlier[len(earlier)-maxEarlierRevisions:]
	}
	plain, err := json.Marshal(earlier)
	if err != nil {
		return "", nil, err
	}
	if s.sealer == nil {
		return "", plain, nil
	}
	return s.sealer.SealDocument(cur.NodeID, earlierRevision, plain)
}

// reportSecretValues answers every value a report's message is scrubbed
// of: the desired revision's and those of the revisions it replaced,
// since the report may name any of them.
func (s *Service) reportSecretValues(c NodeConfig) ([]string, error) {
	values, err := s.sealedValues(c)
	if err != nil {
		return nil, err
	}
	earlier, err := s.earlierValues(c)
	if err != nil {
		return nil, err
	}
	for _, e := range earlier {
		values = append(values, e.Values...)
	}
	return values, nil
}

// ConfigView is a node's configuration as administrators read it
// (GET /api/v1/nodes/{id}/config).
type ConfigView struct {
	Desired         *DesiredView  `json:"desired"`
	Reported        *ReportedView `json:"reported"`
	AppliedRevision int64         `json:"applied_revision"`
	Verdict         string        `json:"verdict"`
	Lagging         bool          `json:"lagging"`
}

// DesiredView is the desired configuration, sealed values masked.
type DesiredView struct {
	Revision    int64           `json:"revision"`
	Hash        string          `json:"hash"`
	Format      string          `json:"format"`
	SizeBytes   int64           `json:"size_bytes"`
	UpdatedAt   time.Time       `json:"updated_at"`
	OperationID string          `json:"operation_id"`
	Document    json.RawMessage `json:"document"`
}

// ReportedView is the node's last report.
type ReportedView struct {
	Revision   int64     `json:"revision"`
	Hash       string    `json:"hash"`
	State      string    `json:"state"`
	Message    string    `json:"message"`
	ObservedAt time.Time `json:"observed_at"`
}

// NodeConfig answers a node's configuration as administrators read it:
// the document with its sealed values masked as "[sealed]". A node never
// configured answers desired null. Errors: ErrNotFound.
func (s *Service) NodeConfig(ctx context.Context, nodeID string) (ConfigView, error) {
	n, err := s.Node(ctx, nodeID)
	if err != nil {
		return ConfigView{}, err
	}
	c, err := s.store.NodeConfig(ctx, nodeID)
	if isNoRows(err) {
		return ConfigView{Verdict: VerdictNone}, nil
	}
	if err != nil {
		return ConfigView{}, err
	}
	// A retired node never lags (the lagging listing and gauge leave it
	// out): it will apply nothing more.
	out := ConfigView{AppliedRevision: c.AppliedRevision, Verdict: c.Verdict(), Lagging: c.Lagging && n.State != StateRetired}
	if c.Revision > 0 {
		doc, err := s.document(c)
		if err != nil {
			return ConfigView{}, err
		}
		for _, p := range c.SealedPointers {
			if doc, err = secrets.ReplaceAt(doc, p, SealedMask); err != nil {
				return ConfigView{}, err
			}
		}
		out.Desired = &DesiredView{Revision: c.Revision, Hash: c.Hash, Format: c.Format, SizeBytes: c.SizeBytes,
			UpdatedAt: c.UpdatedAt, OperationID: c.OperationID, Document: doc}
	}
	if r := c.Reported; r != nil {
		out.Reported = &ReportedView{Revision: r.Revision, Hash: r.Hash, State: r.State, Message: r.Message, ObservedAt: r.ObservedAt}
	}
	return out, nil
}

// LaggingNode is one row of the lagging listing.
type LaggingNode struct {
	NodeID          string    `json:"node_id"`
	DesiredRevision int64     `json:"desired_revision"`
	AppliedRevision int64     `json:"applied_revision"`
	Verdict         string    `json:"verdict"`
	ReportedAt      time.Time `json:"reported_at"`
}

// LaggingPage answers GET /api/v1/config/lagging.
type LaggingPage struct {
	Count         int64         `json:"count"`
	NeverReported int64         `json:"never_reported"`
	Nodes         []LaggingNode `json:"nodes"`
	NextBefore    *string       `json:"next_before"`
}

// LaggingConfigs answers the lagging nodes (not retired, reported at
// least once, applied revision behind the desired one), by node id
// descending, below the cursor before ("" from the start), at most limit;
// with the count of lagging nodes and of nodes that never reported.
func (s *Service) LaggingConfigs(ctx context.Context, before string, limit int) (LaggingPage, error) {
	lagging, never, err := s.store.CountConfigs(ctx)
	if err != nil {
		return LaggingPage{}, err
	}
	rows, err := s.store.LaggingConfigs(ctx, before, limit+1)
	if err != nil {
		return LaggingPage{}, err
	}
	out := LaggingPage{Count: lagging, NeverReported: never, Nodes: []LaggingNode{}}
	for i, c := range rows {
		if i == limit {
			next := out.Nodes[len(out.Nodes)-1].NodeID
			out.NextBefore = &next
			break
		}
		n := LaggingNode{NodeID: c.NodeID, DesiredRevision: c.Revision, AppliedRevision: c.AppliedRevision, Verdict: c.Verdict()}
		if c.Reported != nil {
			n.ReportedAt = c.Reported.ObservedAt
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out, nil
}

// CountLagging answers how many nodes lag (the metric).
func (s *Service) CountLagging(ctx context.Context) (int64, error) {
	n, _, err := s.store.CountConfigs(ctx)
	return n, err
}

// validateConfigEvent checks a config report's shape. A report never
// jams a spool: only what cannot be judged at all is refused.
func validateConfigEvent(v *errcode.Validation, field string, e api.Event) {
	v.Check(e.Facts == nil, field+"/facts", "not allowed on a config event")
	v.Check(e.Workload == nil, field+"/workload", "not allowed on a config event")
	if e.Config == nil {
		v.Add(field+"/config", "required for a config event")
		return
	}
	c := e.Config
	v.Check(c.Revision >= 0, field+"/config/revision", "a revision (0 or more)")
	v.Check(len(c.Hash) <= 128, field+"/config/hash", "at most 128 characters")
	v.Check(c.State == api.ConfigApplied || c.State == api.ConfigFailed, field+"/config/state", "one of applied, failed")
}

// recordConfigReportTx keeps a node's configuration report as its last
// (an older report than the kept one changes nothing), moves the applied
// revision on an applied report naming the desired revision and hash, and
// ends the operations waiting on that revision in the same transaction.
func (s *Service) recordConfigReportTx(ctx context.Context, tx Tx, sess Session, e api.Event, now time.Time) error {
	// The document is read only when its sealed values scrub the message.
	cur, err := tx.LockNodeConfigHead(ctx, sess.NodeID)
	if isNoRows(err) {
		// No row yet: take the node's lock, as a configure does before it
		// writes the first row, so the two never both insert it.
		if _, err := tx.LockNode(ctx, sess.NodeID); err != nil {
			return err
		}
		cur, err = tx.LockNodeConfigHead(ctx, sess.NodeID)
	}
	if err == nil && len(cur.SealedPointers) > 0 {
		cur, err = tx.LockNodeConfig(ctx, sess.NodeID)
	}
	exists := err == nil
	if isNoRows(err) {
		cur, err = NodeConfig{NodeID: sess.NodeID, UpdatedAt: now}, nil
	}
	if err != nil {
		return err
	}
	observed := e.ObservedAt.UTC()
	if cur.Reported != nil && observed.Before(cur.Reported.ObservedAt) {
		return nil
	}
	values, err := s.reportSecretValues(cur)
	if err != nil {
		return err
	}
	rep := e.Config
	wasSettled := cur.Settled
	cur.Reported = &ConfigReport{Revision: rep.Revision, Hash: rep.Hash, State: rep.State,
		Message: truncateMessage(secrets.Scrub(rep.Message, values)), ObservedAt: observed, Fencing: sess.Fencing}
	named := cur.Revision > 0 && rep.Revision == cur.Revision && rep.Hash == cur.Hash
	cur.Settled = named
	if named && rep.State == api.ConfigApplied {
		cur.AppliedRevision = cur.Revision
	}
	cur.setLagging()
	var end *ConfigEnd
	if named {
		// The operations waiting on the desired revision end with it.
		result, _ := json.Marshal(map[string]any{"revision": cur.Revision, "hash": cur.Hash, "state": rep.State})
		end = &ConfigEnd{State: "succeeded", Result: result, At: now}
		if rep.State == api.ConfigFailed {
			msg := cur.Reported.Message
			if msg == "" {
				msg = "the node could not apply the configuration (no reason given)"
			}
			end = &ConfigEnd{State: "failed", Code: "config_failed", Message: msg, At: now}
		}
	}
	if exists {
		_, err = tx.SaveConfigReport(ctx, cur, end)
	} else {
		// No desired configuration, so nothing named: the report alone.
		err = tx.SaveNodeConfig(ctx, cur)
	}
	if err != nil {
		return err
	}
	s.metrics.ConfigReports.WithLabelValues(cur.Verdict()).Inc()
	if !named && wasSettled && cur.Revision > 0 {
		// A report naming another revision unsettles the desired one: it
		// is due again, and replicas that took the node for quiet
		// (dueMemo) must hear so.
		return tx.Notify(ctx, Notification{Kind: NotifyCommands, NodeID: sess.NodeID})
	}
	return nil
}

// truncateMessage bounds a report's message at a rune boundary.
func truncateMessage(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= MaxConfigMessageBytes {
		return s
	}
	cut := MaxConfigMessageBytes - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// ConfigWake says how a due configuration bears on a poll.
type ConfigWake int

// How a configuration bears on a poll.
const (
	// ConfigNotDue: nothing to send.
	ConfigNotDue ConfigWake = iota
	// ConfigRides: due, but delivered to this fencing token within the
	// visibility timeout: it rides along with the next answer and does not
	// cut the wait short.
	ConfigRides
	// ConfigWakes: due and not recently delivered: answer at once.
	ConfigWakes
)

// DueWork is what a poll's one store read finds.
type DueWork struct {
	Commands bool
	// Unsettled: no command is due, but one is pending (delivered within
	// the visibility timeout and not settled), so one falls due again by
	// time alone.
	Unsettled bool
	Config    ConfigWake
}

// quiet reports that nothing is due and nothing will fall due without a
// write: no pending command at all and no configuration due or riding.
func (w DueWork) quiet() bool { return !w.Commands && !w.Unsettled && w.Config == ConfigNotDue }

// awaiting reports that nothing is due and no configuration is due or
// riding, but commands were delivered and are not settled (dueMemo).
func (w DueWork) awaiting() bool { return !w.Commands && w.Unsettled && w.Config == ConfigNotDue }

// deliverConfig answers the configuration due for the session, with its
// real values, and marks it delivered to the session's fencing token;
// nil when none is due (any more). Alone in its answer (background), the
// mark is a background write: a fleet.configure's wave marks every node
// at once, and the fleet's other writes do not queue behind it
// (TxRoute.Background); beside commands it is not, for their answer
// waits on it.
func (s *Service) deliverConfig(ctx context.Context, sess Session, background bool) (*api.ConfigDelivery, error) {
	var c NodeConfig
	due := false
	now := s.clock()
	route := OnNode
	if background {
		route = OnNodeBackground
	}
	err := s.store.Tx(route(ctx, sess.NodeID), func(tx Tx) error {
		var err error
		c, err = tx.LockNodeConfig(ctx, sess.NodeID)
		if isNoRows(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if due = c.dueFor(sess.Fencing); !due {
			return nil
		}
		return tx.MarkConfigDelivered(ctx, sess.NodeID, sess.Fencing, c.Revision, now)
	})
	if err != nil || !due {
		return nil, err
	}
	doc, err := s.document(c)
	if err != nil {
		return nil, err
	}
	s.metrics.ConfigDeliveries.Inc()
	return &api.ConfigDelivery{Revision: c.Revision, Hash: c.Hash, Format: c.Format, Document: doc}, nil
}

// ReleaseConfig makes a configuration a poll carried due again at once for
// the session: the answer that carried it could not be written.
func (s *Service) ReleaseConfig(ctx context.Context, sess Session) error {
	return s.store.Tx(OnNode(ctx, sess.NodeID), func(tx Tx) error {
		c, err := tx.LockNodeConfig(ctx, sess.NodeID)
		if isNoRows(err) {
			return nil
		}
		if err != nil || c.DeliveredFencing == nil || *c.DeliveredFencing != sess.Fencing {
			return err
		}
		if err := tx.MarkConfigDelivered(ctx, sess.NodeID, sess.Fencing, 0, time.Time{}); err != nil {
			return err
		}
		return tx.Notify(ctx, Notification{Kind: NotifyCommands, NodeID: sess.NodeID})
	})
}
