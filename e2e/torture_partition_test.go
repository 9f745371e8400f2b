package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
)

// TestTorturePartitionedAgentIsFenced: an agent cut off from the control
// plane long enough to be replaced — its node reinvited and enrolled by
// another machine — comes back and keeps trying with its old session. Every
// request it makes, at every door, is refused `fenced` (409); nothing it
// reports is applied: not the result of the launch it was handed before
// the partition (that command ends outcome_unknown, DECISIONS §1), not the
// result of a command delivered to its successor, not its workload events;
// the successor applies the node's new work exactly once.
func TestTorturePartitionedAgentIsFenced(t *testing.T) {
	t.Parallel()
	cycles := TortureCycles(2)
	s := StartServer(t, ServerOptions{})
	fig := &Figures{Fault: "partition: a superseded agent keeps trying", Cycles: cycles, Codes: map[string]int{}}
	ctx := context.Background()

	boot, zombie := enrollNode(t, s)
	node := boot.NodeID
	f := fleetAPI{t: t, s: s}
	// Handed a launch, then partitioned before it could report.
	f.issue(node, api.KindLaunchWorkload, "partition-before", api.LaunchWorkload{RunID: "before", AttemptID: "a1", Command: "exit", Args: []string{"0"}})
	got, err := zombie.Commands(ctx, time.Second)
	if err != nil || len(got.Commands) != 1 {
		t.Fatalf("the first agent's poll: %+v %v", got, err)
	}

	// The operator reinvites; another machine enrolls as the node.
	_, raw := f.reinvite(node)
	successor := StartAgent(t, AgentOptions{Name: "successor", Bootstrap: raw, Args: []string{"--runtime", "simulated"}})
	successor.WaitLog(t, "enrolled", time.Minute, nil)
	if c := f.command("partition-before"); c.State != "refused" || c.FailureCode != "outcome_unknown" {
		t.Errorf("the launch delivered before the partition: %s %s, want refused outcome_unknown", c.State, c.FailureCode)
	}

	var ops []issued
	exit0 := 0
	for c := range cycles {
		// New work for the node, while the old agent keeps at it.
		id := fmt.Sprintf("partition-%03d", c)
		f.issue(node, api.KindLaunchWorkload, id, api.LaunchWorkload{RunID: id, AttemptID: "a1", Command: "exit", Args: []string{"0"}})
		ops = append(ops, issued{ID: id, Node: node, Run: id})
		tries := map[string]func() error{
			"poll": func() error { _, err := zombie.Commands(ctx, 0); return err },
			"renew": func() error {
				_, err := zombie.Renew(ctx)
				return err
			},
			"results (its old launch)": func() error {
				_, err := zombie.Results(ctx, []api.Result{{OperationID: "partition-before", Applied: true}})
				return err
			},
			"results (the successor's command)": func() error {
				_, err := zombie.Results(ctx, []api.Result{{OperationID: id, Applied: false, Failure: "forged by the old agent"}})
				return err
			},
			"events": func() error {
				_, err := zombie.Events(ctx, []api.Event{{ID: "zombie-" + id, Kind: "workload", ObservedAt: time.Now().UTC(),
					Workload: &api.WorkloadObservation{RunID: id, AttemptID: "a1", State: "exited", ExitCode: &exit0, ObservedAt: time.Now().UTC()}}})
				return err
			},
			"output": func() error {
				_, err := zombie.Output(ctx, api.OutputRequest{RunID: id, AttemptID: "a1", StdoutTail: "forged"})
				return err
			},
		}
		for door, try := range tries {
			err := try()
			code := client.CodeOf(err)
			fig.Codes[code]++
			if code != "fenced" {
				t.Errorf("cycle %d, %s from the superseded agent: %v, want fenced", c, door, err)
			}
		}
		began := time.Now()
		if got := f.waitSettled(id, 2*time.Minute); got.State != "applied" {
			t.Errorf("%s: %s (%s), want applied by the successor", id, got.State, got.FailureMessage)
		}
		fig.Recovered(time.Since(began))
	}
	verifyExactlyOnce(t, fig, s.URL, s.Token, ops, map[string]string{node: successor.StateDir}, launchCounts(successor))
	for _, op := range ops {
		status, body := s.Call(t, "GET", "/api/v1/nodes/"+node+"/workloads/"+op.Run+"/a1/output", nil, s.Token)
		if status == 200 && strings.Contains(string(body), "forged") {
			t.Errorf("%s: the superseded agent's output was recorded: %s", op.Run, body)
		}
	}
	fig.Notes = append(fig.Notes, "recovery here is the time the successor took to apply each new command while the old agent kept trying")
	fig.Report(t)
}
