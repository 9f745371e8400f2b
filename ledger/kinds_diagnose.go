package ledger

import (
	"context"
	"encoding/json"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
)

// Diagnose kinds (family diagnose, DECISIONS.md §46).
//
// node.diagnose runs one whitelisted, read-only action on a node. It is a
// Record kind like the command kinds (DECISIONS.md §34): its operation is
// the diagnose command's payload `{action, …parameters}`, recorded with its
// durable command in the submitting transaction, delivered over the
// long-poll, holding no executor slot. It succeeds when the agent ran the
// action — whatever the action found (a refused connect is evidence) — with
// the evidence as its result, and fails when the agent refused or could not
// run it (refused_by_node, retryable: it has no effect).
//
// fleet.diagnose fans one action out over node targets or the fleet target
// with a selector; when every child ended, the parent's result carries a
// summary of what they found (DiagnoseSummary).
const (
	KindNodeDiagnose  = "node.diagnose"
	KindFleetDiagnose = "fleet.diagnose"
)

// FleetDiagnoseOperation is fleet.diagnose's operation.
type FleetDiagnoseOperation struct {
	// Diagnose is every child's operation: `{action, …parameters}`.
	Diagnose json.RawMessage `json:"diagnose"`
	// Selector picks the nodes when the target is the fleet.
	Selector *Selector `json:"selector,omitempty"`
	// MaxConcurrency bounds the children handed out at once (0: default).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
}

// DiagnoseKinds are the node-side diagnose kinds, carried out through f
// (diagnose.endpoint, which the control plane runs, registers apart).
func DiagnoseKinds(f *fleet.Service) []*Kind {
	nodeDiagnose := commandKind(f, KindNodeDiagnose, FamilyDiagnose, api.KindDiagnose, func(op json.RawMessage) error {
		var v errcode.Validation
		fleet.ValidateDiagnose(op, "operation/", &v)
		return v.Err()
	})
	return []*Kind{nodeDiagnose, {
		Name: KindFleetDiagnose, Family: FamilyDiagnose, TargetKinds: fanOutTargets, ChildKinds: []string{KindNodeDiagnose},
		Prepare: func(ctx context.Context, d *Draft) error {
			var o FleetDiagnoseOperation
			if err := DecodeOperation(d.Operation, &o); err != nil {
				return err
			}
			return o.validate(d.Targets)
		},
		FanOut: func(ctx context.Context, tx Tx, op Operation) (Plan, error) {
			var o FleetDiagnoseOperation
			if err := DecodeOperation(op.Operation, &o); err != nil {
				return Plan{}, err
			}
			return fanOutPlan(ctx, tx, op.Targets, o.Selector, o.MaxConcurrency, KindNodeDiagnose, o.Diagnose)
		},
		Summarize: func() Summarizer { return &diagnoseSummarizer{} },
	}}
}

func (o FleetDiagnoseOperation) validate(targets []Target) error {
	var v errcode.Validation
	checkFanOutTargets(&v, targets, o.Selector, o.MaxConcurrency)
	if len(o.Diagnose) == 0 || string(o.Diagnose) == "null" {
		v.Add("operation/diagnose", "required: {action, …parameters}")
	} else {
		fleet.ValidateDiagnose(o.Diagnose, "operation/diagnose/", &v)
	}
	return v.Err()
}

// DiagnoseSummary is what a fleet.diagnose's children found, by action:
// how many nodes answered and how many failed; for connect, how many could
// connect; for clock, the worst skew (by its absolute middle, with the
// node); for disk, the fullest path (with the node).
type DiagnoseSummary struct {
	Action    string `json:"action"`
	Answered  int    `json:"answered"`
	Failed    int    `json:"failed"`
	Connected *int   `json:"connected,omitempty"`
	// Unreachable counts the nodes that answered connect without connecting.
	Unreachable *int         `json:"unreachable,omitempty"`
	WorstClock  *ClockWorst  `json:"worst_clock_skew,omitempty"`
	FullestDisk *DiskFullest `json:"fullest_disk,omitempty"`
}

// ClockWorst is the node with the largest clock skew.
type ClockWorst struct {
	NodeID        string `json:"node_id"`
	SkewMs        int64  `json:"skew_ms"`
	UncertaintyMs int64  `json:"uncertainty_ms"`
}

// DiskFullest is the fullest measured path.
type DiskFullest struct {
	NodeID      string  `json:"node_id"`
	Path        string  `json:"path"`
	UsedPercent float64 `json:"used_percent"`
	FreeBytes   int64   `json:"free_bytes"`
}

// SummarizeDiagnose summarises the children of a fleet.diagnose.
func SummarizeDiagnose(children []Operation) DiagnoseSummary {
	var z diagnoseSummarizer
	for _, ch := range children {
		z.Add(ch)
	}
	return z.s
}

// diagnoseSummarizer folds fleet.diagnose's children into a DiagnoseSummary.
type diagnoseSummarizer struct{ s DiagnoseSummary }

func (z *diagnoseSummarizer) Summary() any { return z.s }

func (z *diagnoseSummarizer) Add(ch Operation) {
	s := &z.s
	if s.Action == "" {
		var head struct {
			Action string `json:"action"`
		}
		_ = json.Unmarshal(ch.Operation, &head)
		s.Action = head.Action
		if s.Action == api.DiagConnect {
			zero1, zero2 := 0, 0
			s.Connected, s.Unreachable = &zero1, &zero2
		}
	}
	if ch.State != StateSucceeded {
		s.Failed++
		return
	}
	s.Answered++
	switch s.Action {
	case api.DiagConnect:
		var e api.ConnectEvidence
		if json.Unmarshal(ch.Result, &e) == nil && e.Connected {
			*s.Connected++
		} else {
			*s.Unreachable++
		}
	case api.DiagClock:
		var e api.ClockEvidence
		if json.Unmarshal(ch.Result, &e) != nil || e.Server == nil {
			return
		}
		if s.WorstClock == nil || abs(e.Server.SkewMs) > abs(s.WorstClock.SkewMs) {
			s.WorstClock = &ClockWorst{NodeID: ch.TargetID, SkewMs: e.Server.SkewMs, UncertaintyMs: e.Server.UncertaintyMs}
		}
	case api.DiagDisk:
		var e api.DiskEvidence
		if json.Unmarshal(ch.Result, &e) != nil {
			return
		}
		for _, p := range e.Paths {
			if p.Error != "" || p.TotalBytes == 0 {
				continue
			}
			if s.FullestDisk == nil || p.UsedPct > s.FullestDisk.UsedPercent {
				s.FullestDisk = &DiskFullest{NodeID: ch.TargetID, Path: p.Path, UsedPercent: p.UsedPct, FreeBytes: p.FreeBytes}
			}
		}
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
