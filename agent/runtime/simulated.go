package runtime

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// Simulated is a deterministic runtime that runs nothing, for tests and the
// load tool. Its behaviour is chosen by the launch command:
//
//   - "exit" with args [CODE]: the workload starts and exits at once with CODE;
//   - "fail-start": the launch is refused (the program "could not start");
//   - anything else: the workload runs until Stop (exit code 143, SIGTERM) or
//     until a test calls Exit.
//
// Every attempt writes one line to each stream at launch: stdout
// "RUN/ATTEMPT: COMMAND ARGS...", stderr "RUN/ATTEMPT: simulated".
//
// Artifacts are accepted when their sha256 is well formed, unless the URL is
// listed in FailURLs; images need their artifact prepared first. Like real
// workloads, its state outlives an agent: hand the same Simulated to the
// agent that replaces a stopped one.
type Simulated struct {
	// Now stamps observations (default time.Now).
	Now func() time.Time

	mu        sync.Mutex // guards the following
	artifacts map[string]string
	images    map[string]string
	workloads map[string]*Observation
	outputs   map[string]Output
	order     []string
	calls     map[string]int
	failURLs  map[string]string
}

var _ Runtime = (*Simulated)(nil)

// NewSimulated returns an empty simulated runtime.
func NewSimulated() *Simulated {
	return &Simulated{
		artifacts: map[string]string{},
		images:    map[string]string{},
		workloads: map[string]*Observation{},
		outputs:   map[string]Output{},
		calls:     map[string]int{},
		failURLs:  map[string]string{},
	}
}

func (s *Simulated) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Supports declares the simulated runtime.
func (s *Simulated) Supports() []string { return []string{"simulated"} }

// FailDownload makes prepare_artifact of url refuse with the given
// downloaded digest (a simulated mismatch).
func (s *Simulated) FailDownload(url, gotDigest string) {
	s.mu.Lock()
	s.failURLs[url] = gotDigest
	s.mu.Unlock()
}

// Calls reports how many times a command method was invoked ("launch",
// "stop", "prepare_artifact", "prepare_image"): the effect counter tests use
// to prove nothing was applied twice.
func (s *Simulated) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// PrepareArtifact records the artifact.
func (s *Simulated) PrepareArtifact(_ context.Context, a api.PrepareArtifact) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls["prepare_artifact"]++
	if err := CheckID("artifact_id", a.ArtifactID); err != nil {
		return "", err
	}
	want, err := normalizeDigest(a.SHA256)
	if err != nil {
		return "", err
	}
	if got, ok := s.failURLs[a.URL]; ok {
		return "", fmt.Errorf("digest mismatch for artifact %s: expected sha256:%s, downloaded bytes hash to sha256:%s", a.ArtifactID, want, got)
	}
	s.artifacts[a.ArtifactID] = want
	return fmt.Sprintf("artifact %s simulated as sha256:%s", a.ArtifactID, want), nil
}

// PrepareImage records the image.
func (s *Simulated) PrepareImage(_ context.Context, im api.PrepareImage) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls["prepare_image"]++
	if im.Image == "" {
		return "", fmt.Errorf("image name is required")
	}
	if im.ArtifactID == "" {
		if _, ok := s.images[im.Image]; ok {
			return "image " + im.Image + " already prepared", nil
		}
		s.images[im.Image] = ""
		return "image " + im.Image + " simulated", nil
	}
	d, ok := s.artifacts[im.ArtifactID]
	if !ok {
		return "", fmt.Errorf("artifact %s is not prepared (prepare_artifact first)", im.ArtifactID)
	}
	s.images[im.Image] = d
	return fmt.Sprintf("image %s simulated from sha256:%s", im.Image, d), nil
}

// Launch starts a simulated attempt.
func (s *Simulated) Launch(_ context.Context, l api.LaunchWorkload) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls["launch"]++
	if err := CheckID("run_id", l.RunID); err != nil {
		return err
	}
	if err := CheckID("attempt_id", l.AttemptID); err != nil {
		return err
	}
	key := l.RunID + "/" + l.AttemptID
	if _, ok := s.workloads[key]; ok {
		return ErrWorkloadExists
	}
	if l.Image != "" {
		if _, ok := s.images[l.Image]; !ok {
			return fmt.Errorf("image %q is not prepared (prepare_image first)", l.Image)
		}
	}
	switch l.Command {
	case "":
		return fmt.Errorf("launch_workload: command is required")
	case "fail-start":
		return fmt.Errorf("start %s: simulated start failure", l.Command)
	}
	now := s.now()
	o := &Observation{RunID: l.RunID, AttemptID: l.AttemptID, State: api.WorkloadRunning, CreatedAt: now, StartedAt: now}
	if l.Command == "exit" {
		code := 0
		if len(l.Args) > 0 {
			c, err := strconv.Atoi(l.Args[0])
			if err != nil {
				return fmt.Errorf("exit code %q: %w", l.Args[0], err)
			}
			code = c
		}
		o.State, o.ExitCode, o.ExitedAt = api.WorkloadExited, intPtr(code), now
	}
	s.workloads[key] = o
	s.outputs[key] = Output{
		Stdout: key + ": " + strings.Join(append([]string{l.Command}, l.Args...), " ") + "\n",
		Stderr: key + ": simulated\n",
	}
	s.order = append(s.order, key)
	return nil
}

// Exit ends a running simulated attempt with code, as if the process exited.
func (s *Simulated) Exit(runID, attemptID string, code int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.workloads[runID+"/"+attemptID]
	if !ok {
		return ErrUnknownWorkload
	}
	if o.State != api.WorkloadExited {
		o.State, o.ExitCode, o.ExitedAt = api.WorkloadExited, intPtr(code), s.now()
	}
	return nil
}

// Stop ends a simulated attempt as SIGTERM would (143).
func (s *Simulated) Stop(_ context.Context, st api.StopWorkload) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls["stop"]++
	o, ok := s.workloads[st.RunID+"/"+st.AttemptID]
	if !ok {
		return ErrUnknownWorkload
	}
	if o.State != api.WorkloadExited {
		o.State, o.ExitCode, o.Signal, o.ExitedAt = api.WorkloadExited, intPtr(143), "SIGTERM", s.now()
	}
	return nil
}

// Observe lists the simulated attempts in launch order.
func (s *Simulated) Observe(context.Context) ([]Observation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Observation, 0, len(s.order))
	for _, k := range s.order {
		o := *s.workloads[k]
		if o.ExitCode != nil {
			o.ExitCode = intPtr(*o.ExitCode)
		}
		out = append(out, o)
	}
	return out, nil
}

// Output answers the attempt's simulated output (see Simulated).
func (s *Simulated) Output(_ context.Context, runID, attemptID string) (Output, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.outputs[runID+"/"+attemptID]
	if !ok {
		return Output{}, ErrUnknownWorkload
	}
	return o, nil
}

// Workloads lists the keys of all attempts ever launched, in order.
func (s *Simulated) Workloads() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}
