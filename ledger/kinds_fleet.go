package ledger

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sort"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
)

// KindFleetCommand fans one node command out over many nodes (family
// fleet): a list of node targets, or the fleet target with a selector.
const KindFleetCommand = "fleet.command"

// MaxFanOut bounds the children of one fan-out.
const MaxFanOut = 10000

// FleetCommandOperation is fleet.command's operation.
type FleetCommandOperation struct {
	// Kind is a command kind (node.prepare_image, …).
	Kind string `json:"kind"`
	// Payload is every child's operation: the command's payload.
	Payload json.RawMessage `json:"payload"`
	// Selector picks the nodes when the target is the fleet.
	Selector *Selector `json:"selector,omitempty"`
	// MaxConcurrency bounds the children handed out at once (default 50,
	// as mature fleet tools default; 0 is the default).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
}

// Selector picks nodes by state (default ready), purchase class and agent
// labels (all must match).
type Selector struct {
	// State is nil when the selector names none (ready); an empty
	// string is refused like any other state that is not one.
	State  *string           `json:"state,omitempty"`
	Class  string            `json:"class,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// DefaultMaxConcurrency is a fan-out's limit when the operation names none.
const DefaultMaxConcurrency = 50

func (o FleetCommandOperation) validate(targets []Target) error {
	var v errcode.Validation
	_, known := CommandKinds[o.Kind]
	v.Check(known, "operation/kind", "one of node.prepare_image, node.prepare_artifact, node.launch_workload, node.stop_workload")
	checkFanOutTargets(&v, targets, o.Selector, o.MaxConcurrency)
	if err := v.Err(); err != nil {
		return err
	}
	if err := fleet.ValidateCommand(CommandKinds[o.Kind], o.Payload); err != nil {
		return err
	}
	return nil
}

// checkFanOutTargets checks a fan-out's targeting (fleet.command,
// fleet.configure): node targets named once, or the fleet target with a
// selector.
func checkFanOutTargets(v *errcode.Validation, targets []Target, sel *Selector, maxConcurrency int) {
	v.Check(maxConcurrency >= 0 && maxConcurrency <= MaxFanOut, "operation/max_concurrency", "0 to %d", MaxFanOut)
	fleetTarget := len(targets) == 1 && targets[0].Kind == TargetFleet
	switch {
	case fleetTarget:
		v.Check(sel != nil, "operation/selector", "required with the fleet target")
	case len(targets) == 0:
		v.Add("targets", "node targets, or one {kind: fleet} with operation.selector")
	default:
		v.Check(sel == nil, "operation/selector", "only with the fleet target")
		v.Check(len(targets) <= MaxFanOut, "targets", "at most %d", MaxFanOut)
		seen := map[string]bool{}
		for i, t := range targets {
			if t.Kind != TargetNode || t.ID == "" || seen[t.ID] {
				v.Add("targets/"+itoa(i), "a {kind: node, id} named once")
			}
			seen[t.ID] = true
		}
	}
	if s := sel; s != nil && s.State != nil {
		v.Check(fleet.State(*s.State).Valid(), "operation/selector/state", "one of enrolling, ready, lost, retired")
	}
}

// fanOutPlan is the plan of a fan-out that gives every node its targets
// name, or its selector picks for the fleet target, one child of kind
// with the same operation, at most maxConcurrency of them running at once
// (0: DefaultMaxConcurrency).
func fanOutPlan(ctx context.Context, tx Tx, targets []Target, sel *Selector, maxConcurrency int, kind string, operation json.RawMessage) (Plan, error) {
	nodes, err := fanOutNodes(ctx, tx, targets, sel)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{MaxConcurrency: maxConcurrency, Children: make([]Child, 0, len(nodes))}
	if plan.MaxConcurrency == 0 {
		plan.MaxConcurrency = DefaultMaxConcurrency
	}
	for _, id := range nodes {
		plan.Children = append(plan.Children, Child{Kind: kind, Targets: []Target{{Kind: TargetNode, ID: id}}, Operation: operation})
	}
	return plan, nil
}

// fanOutNodes answers the nodes a fan-out's targets name, or those its
// selector picks for the fleet target.
func fanOutNodes(ctx context.Context, tx Tx, targets []Target, sel *Selector) ([]string, error) {
	if len(targets) == 1 && targets[0].Kind == TargetFleet {
		return selectNodes(ctx, tx.Fleet(), *sel)
	}
	nodes := make([]string, 0, len(targets))
	for _, t := range targets {
		nodes = append(nodes, t.ID)
	}
	return nodes, nil
}

// FleetKinds are the kinds of family fleet.
func FleetKinds() []*Kind {
	return []*Kind{{
		Name: KindFleetCommand, Family: FamilyFleet, TargetKinds: fanOutTargets, ChildKinds: slices.Sorted(maps.Keys(CommandKinds)),
		Prepare: func(ctx context.Context, d *Draft) error {
			var o FleetCommandOperation
			if err := DecodeOperation(d.Operation, &o); err != nil {
				return err
			}
			return o.validate(d.Targets)
		},
		FanOut: func(ctx context.Context, tx Tx, op Operation) (Plan, error) {
			var o FleetCommandOperation
			if err := DecodeOperation(op.Operation, &o); err != nil {
				return Plan{}, err
			}
			return fanOutPlan(ctx, tx, op.Targets, o.Selector, o.MaxConcurrency, o.Kind, o.Payload)
		},
	}}
}

// selectNodes answers the ids of the nodes a selector picks, by id, at most
// MaxFanOut (more is refused: narrow the selector).
func selectNodes(ctx context.Context, r fleet.Reader, sel Selector) ([]string, error) {
	state := fleet.StateReady
	if sel.State != nil {
		state = fleet.State(*sel.State)
	}
	var out []string
	f := fleet.NodeFilter{State: state, Limit: 500}
	for {
		page, err := r.ListNodes(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, n := range page {
			if matches(n, sel) {
				out = append(out, n.ID)
			}
		}
		if len(out) > MaxFanOut {
			return nil, errcode.Errorf(errcode.ValidationFailed, "the selector picks more than %d nodes", MaxFanOut)
		}
		if len(page) < f.Limit {
			break
		}
		last := page[len(page)-1]
		f.BeforeCreated, f.BeforeID = &last.CreatedAt, last.ID
	}
	sort.Strings(out)
	return out, nil
}

func matches(n fleet.Node, sel Selector) bool {
	if sel.Class != "" {
		found := false
		for _, c := range n.Purchase.EligibleClasses {
			found = found || c == sel.Class
		}
		if !found {
			return false
		}
	}
	if len(sel.Labels) == 0 {
		return true
	}
	var facts struct {
		Labels map[string]string `json:"labels"`
	}
	_ = json.Unmarshal(n.Facts, &facts)
	for k, v := range sel.Labels {
		if facts.Labels[k] != v {
			return false
		}
	}
	return true
}
