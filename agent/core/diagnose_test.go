package core

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/nodeward/nodeward/agent/api"
)

func diagnoseCmd(op string, payload any) api.Command {
	c := command(op, api.KindDiagnose, payload)
	return c
}

// answer waits for the one answer to op and decodes its evidence into ev.
func (b *bundle) answer(op string, ev any) api.Result {
	b.t.Helper()
	b.eventually("the answer to "+op, 0, func() bool { return len(b.cp.resultsFor(op)) >= 1 })
	r := b.cp.resultsFor(op)[0]
	if ev != nil {
		if !r.Applied || r.Duplicate || r.Failure != "" || len(r.Evidence) == 0 {
			b.t.Fatalf("%s: want applied with evidence, got %+v", op, r)
		}
		if err := json.Unmarshal(r.Evidence, ev); err != nil {
			b.t.Fatalf("%s: evidence %s: %v", op, r.Evidence, err)
		}
	}
	return r
}

// closedPort answers a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

func TestDiagnose(t *testing.T) {
	t.Run("FactsReportDiag", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		b.eventually("a heartbeat", 0, func() bool { return len(b.cp.heartbeats()) > 0 })
		if caps := b.cp.heartbeats()[0].Facts.Capabilities; !slices.Contains(caps, api.CapDiag) || !slices.Contains(caps, api.CapCommands) {
			t.Fatalf("capabilities %v", caps)
		}
		b.cp.with(func() {
			if !slices.Contains(b.cp.enrolls[0].Facts.Capabilities, api.CapDiag) {
				t.Fatalf("enrollment facts %v", b.cp.enrolls[0].Facts.Capabilities)
			}
		})
	})

	t.Run("EveryActionAnswersEvidence", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		open := ln.Addr().(*net.TCPAddr).Port
		closed := closedPort(t)
		extra := t.TempDir()

		b.cp.push(launch("op-launch", "run-1", "a1", "sleep"))
		b.answer("op-launch", nil)
		clock := diagnoseCmd("d-clock", map[string]any{"action": "clock"})
		clock.IssuedAt = b.clk.Now().Add(-1500 * 1e6)
		b.cp.push(
			diagnoseCmd("d-disk", map[string]any{"action": "disk", "paths": []string{extra, "/no/such/path"}}),
			diagnoseCmd("d-workloads", map[string]any{"action": "workloads"}),
			diagnoseCmd("d-open", map[string]any{"action": "connect", "host": "127.0.0.1", "port": open, "timeout_seconds": 2}),
			diagnoseCmd("d-closed", map[string]any{"action": "connect", "host": "127.0.0.1", "port": closed}),
			diagnoseCmd("d-resolve", map[string]any{"action": "resolve", "names": []string{"localhost"}}),
			clock,
			diagnoseCmd("d-agent", map[string]any{"action": "agent"}),
		)

		var disk api.DiskEvidence
		b.answer("d-disk", &disk)
		if len(disk.Paths) != 3 || disk.Paths[0].Path != b.store.Dir() || disk.Paths[0].TotalBytes <= 0 ||
			disk.Paths[1].Path != extra || disk.Paths[1].Error != "" || disk.Paths[2].Error == "" || disk.RanAt.IsZero() {
			t.Fatalf("disk evidence %+v", disk)
		}
		var wl api.WorkloadsEvidence
		b.answer("d-workloads", &wl)
		if len(wl.Workloads) != 1 || wl.Workloads[0].RunID != "run-1" || wl.Workloads[0].State == "" {
			t.Fatalf("workloads evidence %+v", wl)
		}
		var ok api.ConnectEvidence
		b.answer("d-open", &ok)
		if !ok.Connected || ok.Error != "" || ok.TimeoutSeconds != 2 || ok.RemoteAddr == "" {
			t.Fatalf("connect evidence %+v", ok)
		}
		// A refused connect is evidence, not a failure.
		var refused api.ConnectEvidence
		b.answer("d-closed", &refused)
		if refused.Connected || refused.Error == "" || refused.Port != closed || refused.TimeoutSeconds != 5 {
			t.Fatalf("closed-port evidence %+v", refused)
		}
		var res api.ResolveEvidence
		b.answer("d-resolve", &res)
		if len(res.Results) != 1 || res.Results[0].Name != "localhost" || len(res.Results[0].Addresses) == 0 {
			t.Fatalf("resolve evidence %+v", res)
		}
		var clk api.ClockEvidence
		b.answer("d-clock", &clk)
		if clk.IssuedAt == nil || clk.NodeMinusIssuedMs == nil || *clk.NodeMinusIssuedMs != 1500 || !clk.NodeTime.Equal(b.clk.Now()) {
			t.Fatalf("clock evidence %+v", clk)
		}
		var ag api.AgentEvidence
		b.answer("d-agent", &ag)
		if ag.Version != "test" || !slices.Contains(ag.Capabilities, api.CapDiag) || ag.JournalOps < 1 || ag.JournalBytes <= 0 ||
			len(ag.Runtimes) != 1 || ag.StartedAt.IsZero() {
			t.Fatalf("agent evidence %+v", ag)
		}
	})

	// The agent validates again whatever the server sends: a forged action
	// or parameters out of range are refused, naming the field.
	t.Run("ForgedOrOutOfRangeRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		cases := []struct {
			op      string
			payload any
			field   string
		}{
			{"f-shell", map[string]any{"action": "shell", "command": "rm -rf /"}, "action"},
			{"f-none", map[string]any{}, "action"},
			{"f-relative", map[string]any{"action": "disk", "paths": []string{"etc"}}, "paths/0"},
			{"f-many", map[string]any{"action": "disk", "paths": []string{"/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h", "/i"}}, "paths"},
			{"f-port", map[string]any{"action": "connect", "host": "127.0.0.1", "port": 70000}, "port"},
			{"f-port0", map[string]any{"action": "connect", "host": "127.0.0.1", "port": 0}, "port"},
			{"f-host", map[string]any{"action": "connect", "host": "a b;rm", "port": 22}, "host"},
			{"f-timeout", map[string]any{"action": "connect", "host": "127.0.0.1", "port": 22, "timeout_seconds": 11}, "timeout_seconds"},
			{"f-names", map[string]any{"action": "resolve", "names": []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"}}, "names"},
			{"f-badname", map[string]any{"action": "resolve", "names": []string{"-bad-"}}, "names/0"},
			{"f-foreign", map[string]any{"action": "clock", "host": "x"}, "host"},
		}
		for _, c := range cases {
			b.cp.push(diagnoseCmd(c.op, c.payload))
		}
		for _, c := range cases {
			r := b.answer(c.op, nil)
			if r.Applied || len(r.Evidence) != 0 || !strings.Contains(r.Failure, c.field+":") {
				t.Fatalf("%s: want a refusal naming %s, got %+v", c.op, c.field, r)
			}
		}
	})

	// A diagnose is read-only: a redelivery is answered with the evidence
	// recorded, never a bare duplicate.
	t.Run("RedeliveryAnswersEvidenceAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		cmd := diagnoseCmd("d-1", map[string]any{"action": "clock"})
		b.cp.push(cmd)
		first := b.answer("d-1", &api.ClockEvidence{})
		b.eventually("the answer acknowledged", 0, func() bool { return len(b.store.UnackedResults()) == 0 })
		b.cp.push(cmd)
		b.eventually("the second answer", 0, func() bool { return len(b.cp.resultsFor("d-1")) == 2 })
		again := b.cp.resultsFor("d-1")[1]
		if !again.Applied || again.Duplicate || string(again.Evidence) != string(first.Evidence) {
			t.Fatalf("redelivery answered %+v, first %+v", again, first)
		}
	})
}
