package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeward/nodeward/agent/api"
)

// Diagnostics (DECISIONS.md §46). A diagnose command runs one action of a
// fixed whitelist, read-only, and answers Result{applied: true, evidence}.
// The payload is validated here again (api.ValidateDiagnose, as the server
// did): anything else — an unknown action, a parameter of another action,
// a relative path, a port or timeout out of range — is refused with a
// failure naming the field, even when the server sent it. Nothing here
// runs a shell or any program.
//
// Diagnoses go through the journal like every command, so their evidence
// stays owed across a restart until the server settles it. A redelivered
// diagnose that is done is answered with the evidence recorded (never a
// bare duplicate, which would leave the operation without evidence); one
// interrupted by a crash is simply run again (it has no effect to protect).

// maxResolveAddresses bounds the addresses kept per resolved name.
const maxResolveAddresses = 32

// diagnose validates and runs one diagnose payload, answering its evidence
// or why it was refused.
func (a *Agent) diagnose(ctx context.Context, cmd api.Command) (json.RawMessage, error) {
	d, problems := api.ValidateDiagnose(cmd.Payload)
	if len(problems) > 0 {
		msgs := make([]string, len(problems))
		for i, p := range problems {
			field := p.Field
			if field == "" {
				field = "payload"
			}
			msgs[i] = field + ": " + p.Message
		}
		return nil, fmt.Errorf("diagnose refused: %s", strings.Join(msgs, "; "))
	}
	now := a.clock.Now().UTC()
	var ev any
	switch d.Action {
	case api.DiagDisk:
		e := api.DiskEvidence{Action: d.Action, RanAt: now, Paths: []api.DiskUsage{diskUsage(a.store.Dir())}}
		for _, p := range d.Paths {
			e.Paths = append(e.Paths, diskUsage(p))
		}
		ev = e
	case api.DiagWorkloads:
		obs, err := a.rt.Observe(ctx)
		if err != nil {
			return nil, fmt.Errorf("observe workloads: %w", err)
		}
		e := api.WorkloadsEvidence{Action: d.Action, RanAt: now, Workloads: []api.WorkloadEvidence{}}
		for _, o := range obs {
			w := api.WorkloadEvidence{RunID: o.RunID, AttemptID: o.AttemptID, State: o.State, ExitCode: o.ExitCode,
				Signal: o.Signal, SupervisorLost: o.Lost, Failure: clipText(o.Failure, 512)}
			if !o.StartedAt.IsZero() {
				t := o.StartedAt.UTC()
				w.StartedAt = &t
			}
			if !o.ExitedAt.IsZero() {
				t := o.ExitedAt.UTC()
				w.ExitedAt = &t
			}
			e.Workloads = append(e.Workloads, w)
		}
		// Keep the evidence within its bound: the oldest attempts go first.
		for {
			b, _ := json.Marshal(e)
			if len(b) <= api.MaxEvidenceBytes || len(e.Workloads) == 0 {
				break
			}
			e.Workloads, e.Truncated = e.Workloads[len(e.Workloads)/4+1:], true
		}
		ev = e
	case api.DiagConnect:
		ev = connect(ctx, d, now)
	case api.DiagResolve:
		ev = resolve(ctx, d, now)
	case api.DiagClock:
		e := api.ClockEvidence{Action: d.Action, RanAt: now, NodeTime: now}
		if !cmd.IssuedAt.IsZero() {
			issued := cmd.IssuedAt.UTC()
			diff := now.Sub(issued).Milliseconds()
			e.IssuedAt, e.NodeMinusIssuedMs = &issued, &diff
		}
		ev = e
	case api.DiagAgent:
		ev = a.agentEvidence(now)
	default:
		// ValidateDiagnose knows no other action; refuse rather than run
		// anything it might one day let through.
		return nil, fmt.Errorf("diagnose refused: action %q is not run by this agent", d.Action)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	if len(b) > api.MaxEvidenceBytes {
		return nil, fmt.Errorf("diagnose %s: evidence exceeds %d bytes", d.Action, api.MaxEvidenceBytes)
	}
	return b, nil
}

func diskUsage(p string) api.DiskUsage {
	u := api.DiskUsage{Path: p}
	var s unix.Statfs_t
	if err := unix.Statfs(p, &s); err != nil {
		u.Error = clipText(err.Error(), 256)
		return u
	}
	bs := int64(s.Bsize)
	u.TotalBytes = int64(s.Blocks) * bs
	u.FreeBytes = int64(s.Bavail) * bs
	u.UsedBytes = u.TotalBytes - int64(s.Bfree)*bs
	if denom := u.UsedBytes + u.FreeBytes; denom > 0 {
		// As df computes it: used over what an unprivileged user may fill.
		u.UsedPct = float64(int64(float64(u.UsedBytes)*10000/float64(denom))) / 100
	}
	return u
}

func connect(ctx context.Context, d api.Diagnose, now time.Time) api.ConnectEvidence {
	timeout := d.ConnectTimeout()
	e := api.ConnectEvidence{Action: d.Action, RanAt: now, Host: d.Host, Port: d.Port, TimeoutSeconds: timeout.Seconds()}
	dialer := net.Dialer{Timeout: timeout}
	start := time.Now()
	conn, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(d.Host, strconv.Itoa(d.Port)))
	e.LatencyMs = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		e.Error = clipText(err.Error(), 512)
		return e
	}
	e.Connected = true
	e.RemoteAddr = conn.RemoteAddr().String()
	_ = conn.Close()
	return e
}

func resolve(ctx context.Context, d api.Diagnose, now time.Time) api.ResolveEvidence {
	e := api.ResolveEvidence{Action: d.Action, RanAt: now}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, name := range d.Names {
		r := api.ResolveResult{Name: name, Addresses: []string{}}
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		if err != nil {
			r.Error = clipText(err.Error(), 256)
		}
		if len(addrs) > maxResolveAddresses {
			addrs = addrs[:maxResolveAddresses]
		}
		r.Addresses = append(r.Addresses, addrs...)
		e.Results = append(e.Results, r)
	}
	return e
}

func (a *Agent) agentEvidence(now time.Time) api.AgentEvidence {
	pending, dropped := a.store.SpoolStats()
	ops, opBytes := dirSize(a.store.Path("ops"))
	_, spoolBytes := dirSize(a.store.Path("spool"))
	return api.AgentEvidence{Action: api.DiagAgent, RanAt: now, Version: a.cfg.Version, StartedAt: a.started.UTC(),
		UptimeSeconds: int64(now.Sub(a.started).Seconds()), SpoolEvents: pending, SpoolBytes: spoolBytes,
		DroppedHeartbeats: dropped, JournalOps: ops, JournalBytes: opBytes,
		UnackedResults: len(a.store.UnackedResults()), Capabilities: Capabilities, Runtimes: a.rt.Supports()}
}

// dirSize answers how many regular files a directory holds and their size.
func dirSize(dir string) (int, int64) {
	n, total := 0, int64(0)
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return nil
		}
		if e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				n++
				total += info.Size()
			}
		}
		return nil
	})
	return n, total
}

func clipText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
