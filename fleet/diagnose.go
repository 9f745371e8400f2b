package fleet

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/secrets"
)

// Diagnose commands (DECISIONS.md §46) ride the command path: one durable
// command of kind diagnose, delivered over the long-poll, answered by the
// agent with Result{applied: true, evidence}. The evidence (at most 64 KiB,
// a JSON object, scrubbed like failure text) becomes the command's
// operation's result; an applied diagnose without evidence records the
// plain command result. A diagnose is read-only: an agent answers a
// redelivery with the evidence it recorded (never a bare duplicate).

// ValidateDiagnose checks a diagnose payload, naming fields under prefix
// ("operation/" for the ledger, "payload." for the command wrapper).
func ValidateDiagnose(payload json.RawMessage, prefix string, v *errcode.Validation) {
	_, problems := api.ValidateDiagnose(payload)
	for _, p := range problems {
		field := prefix + p.Field
		if p.Field == "" {
			field = trimSep(prefix)
		}
		v.Add(field, "%s", p.Message)
	}
}

func trimSep(prefix string) string {
	if n := len(prefix); n > 0 && (prefix[n-1] == '/' || prefix[n-1] == '.') {
		return prefix[:n-1]
	}
	return prefix
}

func init() {
	commandKinds[api.KindDiagnose] = func(p json.RawMessage, v *errcode.Validation) {
		ValidateDiagnose(p, "payload.", v)
	}
}

// CodeEvidenceInvalid refuses a diagnose answer whose evidence is not a
// JSON object of at most 64 KiB.
const CodeEvidenceInvalid = "evidence_invalid"

// settleEvidence takes a diagnose command's evidence into c (Evidence),
// scrubbed of values and, for a clock answer, with the server's own skew
// bounds; evidence that is not a JSON object within the bound refuses the
// command instead.
func settleEvidence(c *Command, evidence json.RawMessage, values []string, now time.Time) {
	if len(evidence) == 0 {
		return
	}
	trimmed := bytes.TrimSpace(evidence)
	if len(trimmed) > api.MaxEvidenceBytes || len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		c.State = CommandRefused
		c.FailureCode = CodeEvidenceInvalid
		c.FailureMessage = "the node's evidence is not a JSON object of at most 64 KiB"
		return
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, secrets.ScrubJSON(json.RawMessage(trimmed), values)); err != nil {
		c.State = CommandRefused
		c.FailureCode = CodeEvidenceInvalid
		c.FailureMessage = "the node's evidence is not valid JSON"
		return
	}
	out := json.RawMessage(buf.Bytes())
	var head struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal(out, &head)
	// The first delivery bounds the node's reading from below whichever
	// delivery it answered: an agent answers redeliveries with what it
	// recorded, and runs it again only after it had it once.
	if head.Action == api.DiagClock && c.FirstDeliveredAt != nil {
		out = withClockBounds(out, *c.FirstDeliveredAt, now)
	}
	c.Evidence = out
}

// withClockBounds adds the server's skew bounds to a clock answer: the
// node read its clock after the server delivered the command (at
// delivered, server time) and before the server received the answer (at
// received), so node_time − received ≤ skew ≤ node_time − delivered.
// The node's own account is kept as it said it.
func withClockBounds(evidence json.RawMessage, delivered, received time.Time) json.RawMessage {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(evidence, &doc); err != nil {
		return evidence
	}
	var nodeTime time.Time
	if err := json.Unmarshal(doc["node_time"], &nodeTime); err != nil || nodeTime.IsZero() {
		return evidence
	}
	// Whole milliseconds that still hold the true skew: the lower bound
	// rounded down, the upper up, and the uncertainty about the midpoint
	// rounded up (Milliseconds truncates toward zero, which narrowed
	// both bounds whenever one was negative or fractional).
	lo := floorMs(nodeTime.Sub(received))
	hi := ceilMs(nodeTime.Sub(delivered))
	mid := lo + (hi-lo)/2
	b := api.ClockBounds{DeliveredAt: delivered.UTC(), ReceivedAt: received.UTC(), SkewMinMs: lo, SkewMaxMs: hi,
		SkewMs: mid, UncertaintyMs: max(mid-lo, hi-mid)}
	raw, err := json.Marshal(b)
	if err != nil {
		return evidence
	}
	doc["server"] = raw
	out, err := json.Marshal(doc)
	if err != nil || len(out) > api.MaxEvidenceBytes {
		return evidence
	}
	return out
}

// floorMs and ceilMs round d to whole milliseconds down and up.
func floorMs(d time.Duration) int64 {
	ms := d.Milliseconds()
	if time.Duration(ms)*time.Millisecond > d {
		ms--
	}
	return ms
}

func ceilMs(d time.Duration) int64 {
	ms := d.Milliseconds()
	if time.Duration(ms)*time.Millisecond < d {
		ms++
	}
	return ms
}
