package runtime

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// The test binary doubles as the supervisor: Launch re-executes it with this
// variable set, and TestMain hands over to ShimMain before any test runs.
const shimEnvVar = "NODEWARD_RUNTIME_TEST_SHIM"

func TestMain(m *testing.M) {
	if os.Getenv(shimEnvVar) == "1" {
		os.Exit(ShimMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func newProcess(t *testing.T, dir string) *Process {
	t.Helper()
	p, err := NewProcess(ProcessOptions{
		StateDir: dir,
		ShimPath: os.Args[0],
		ShimArgs: []string{"shim"},
		ShimEnv:  []string{shimEnvVar + "=1"},
		NoSync:   false,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Supervisors outlive the exit they report by a moment: wait for every
	// one to let go of its attempt before the temp dir is removed.
	t.Cleanup(func() {
		attempts, _ := filepath.Glob(filepath.Join(dir, "workloads", "*", "attempts", "*"))
		deadline := time.Now().Add(20 * time.Second)
		for _, a := range attempts {
			for lockHeld(a) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	return p
}

func observation(t *testing.T, p *Process, run, attempt string) (Observation, bool) {
	t.Helper()
	obs, err := p.Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range obs {
		if o.RunID == run && o.AttemptID == attempt {
			return o, true
		}
	}
	return Observation{}, false
}

// launchCountingTerms launches run r attempt a: a shell that notes every
// SIGTERM it gets and runs on. It answers how many it got so far.
func launchCountingTerms(t *testing.T, p *Process) func() int {
	t.Helper()
	terms := filepath.Join(t.TempDir(), "terms")
	ready := filepath.Join(t.TempDir(), "ready")
	err := p.Launch(context.Background(), api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "sh",
		Args: []string{"-c", `trap 'echo term >> "$TERMS"' TERM; touch "$READY"; while :; do sleep 0.05; done`},
		Env:  map[string]string{"TERMS": terms, "READY": ready}})
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the trap to be installed", 20*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
	return func() int {
		b, _ := os.ReadFile(terms)
		return strings.Count(string(b), "term")
	}
}

func TestProcess(t *testing.T) {
	t.Run("ExitCodeSurvivesAgentObjectLoss", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := newProcess(t, dir)
		ctx := context.Background()
		// The workload outlives the first runtime object: it waits for a file.
		gate := filepath.Join(t.TempDir(), "gate")
		err := p.Launch(ctx, api.LaunchWorkload{RunID: "run-1", AttemptID: "a1", Command: "sh",
			Args: []string{"-c", `while [ ! -e "$GATE" ]; do sleep 0.01; done; echo out; echo err >&2; exit 3`},
			Env:  map[string]string{"GATE": gate}})
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := observation(t, p, "run-1", "a1"); o.State != api.WorkloadRunning {
			t.Fatalf("state after launch = %q, want running", o.State)
		}
		p = nil // the agent-side object is gone, as after an agent restart

		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p2 := newProcess(t, dir)
		var o Observation
		testwait.For(t, "the exit", 20*time.Second, func() bool {
			o, _ = observation(t, p2, "run-1", "a1")
			return o.State == api.WorkloadExited
		})
		if o.ExitCode == nil || *o.ExitCode != 3 || o.Lost {
			t.Fatalf("exit = %+v, want code 3", o)
		}
		out, _ := os.ReadFile(filepath.Join(p2.attemptDir("run-1", "a1"), fileStdout))
		errOut, _ := os.ReadFile(filepath.Join(p2.attemptDir("run-1", "a1"), fileStderr))
		if string(out) != "out\n" || string(errOut) != "err\n" {
			t.Fatalf("logs = %q / %q", out, errOut)
		}
		// Launching the same attempt again never starts it twice.
		if err := p2.Launch(ctx, api.LaunchWorkload{RunID: "run-1", AttemptID: "a1", Command: "sh"}); !errors.Is(err, ErrWorkloadExists) {
			t.Fatalf("relaunch = %v, want ErrWorkloadExists", err)
		}
	})

	t.Run("QuickExit", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		if err := p.Launch(context.Background(), api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "/bin/sh", Args: []string{"-c", "exit 7"}}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "the exit", 20*time.Second, func() bool {
			o, _ := observation(t, p, "r", "a")
			return o.State == api.WorkloadExited && o.ExitCode != nil && *o.ExitCode == 7
		})
	})

	t.Run("EnvAndWorkDir", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		err := p.Launch(context.Background(), api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "sh",
			Args: []string{"-c", `echo "$FOO:$NODEWARD_RUN_ID:$(pwd)" > out.txt`}, Env: map[string]string{"FOO": "bar"},
			CacheVolumes: []string{"pip"}})
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "the exit", 20*time.Second, func() bool {
			o, _ := observation(t, p, "r", "a")
			return o.State == api.WorkloadExited
		})
		work := filepath.Join(p.dir, "workloads", "r", "work")
		b, err := os.ReadFile(filepath.Join(work, "out.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != "bar:r:"+work {
			t.Fatalf("workload saw %q", got)
		}
	})

	t.Run("MissingCommandRefusedWithoutRecord", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		err := p.Launch(context.Background(), api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "no-such-program-xyz"})
		if err == nil || !strings.Contains(err.Error(), "not found") {
			t.Fatalf("err = %v", err)
		}
		if _, ok := observation(t, p, "r", "a"); ok {
			t.Fatal("a refused launch left an attempt behind")
		}
	})

	t.Run("StopEscalatesToKill", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		ctx := context.Background()
		ready := filepath.Join(t.TempDir(), "ready")
		err := p.Launch(ctx, api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "sh",
			Args: []string{"-c", `trap '' TERM; touch "$READY"; while :; do sleep 0.05; done`},
			Env:  map[string]string{"READY": ready}})
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "the trap to be installed", 20*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
		if err := p.Stop(ctx, api.StopWorkload{RunID: "r", AttemptID: "a", GraceSeconds: 1}); err != nil {
			t.Fatal(err)
		}
		o, _ := observation(t, p, "r", "a")
		if o.State != api.WorkloadExited || o.ExitCode == nil || *o.ExitCode != 128+9 || o.Signal != "SIGKILL" {
			t.Fatalf("after stop: %+v (code %v)", o, o.ExitCode)
		}
		// Stopping again is a no-op.
		if err := p.Stop(ctx, api.StopWorkload{RunID: "r", AttemptID: "a", GraceSeconds: 1}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("StopResumedAfterRestartSendsNoSecondTerm", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := newProcess(t, dir)
		termCount := launchCountingTerms(t, p)
		// The agent stops the workload and dies inside the grace.
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		go func() { stopped <- p.Stop(ctx, api.StopWorkload{RunID: "r", AttemptID: "a", GraceSeconds: 3600}) }()
		testwait.For(t, "the workload to see SIGTERM", 20*time.Second, func() bool { return termCount() == 1 })
		cancel()
		if err := <-stopped; err == nil {
			t.Fatal("a stop whose agent went away reported the workload stopped")
		}
		// The restarted agent resolves its journal's "started" stop, and a
		// second stop operation names the same attempt: neither signals
		// TERM again; the second's shorter grace brings SIGKILL forward.
		p2 := newProcess(t, dir)
		if err := p2.Stop(context.Background(), api.StopWorkload{RunID: "r", AttemptID: "a", GraceSeconds: 1}); err != nil {
			t.Fatal(err)
		}
		o, _ := observation(t, p2, "r", "a")
		if o.State != api.WorkloadExited || o.Signal != "SIGKILL" {
			t.Fatalf("after the resumed stop: %+v", o)
		}
		if n := termCount(); n != 1 {
			t.Fatalf("the workload saw SIGTERM %d times, want once", n)
		}
	})

	t.Run("StopDeadlineHoldsWithoutTheAgent", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		termCount := launchCountingTerms(t, p)
		// The agent stops the workload (grace 1 s) and goes away at once,
		// never to come back: the supervisor keeps the deadline.
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		go func() { stopped <- p.Stop(ctx, api.StopWorkload{RunID: "r", AttemptID: "a", GraceSeconds: 1}) }()
		testwait.For(t, "the workload to see SIGTERM", 20*time.Second, func() bool { return termCount() == 1 })
		cancel()
		<-stopped
		var o Observation
		testwait.For(t, "the supervisor to kill the workload at the deadline", 30*time.Second, func() bool {
			o, _ = observation(t, p, "r", "a")
			return o.State == api.WorkloadExited
		})
		if o.Signal != "SIGKILL" {
			t.Fatalf("after the deadline: %+v", o)
		}
		if n := termCount(); n != 1 {
			t.Fatalf("the workload saw SIGTERM %d times, want once", n)
		}
	})

	t.Run("StopHonoursTerm", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		ctx := context.Background()
		if err := p.Launch(ctx, api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "sleep", Args: []string{"300"}}); err != nil {
			t.Fatal(err)
		}
		if err := p.Stop(ctx, api.StopWorkload{RunID: "r", AttemptID: "a", GraceSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		o, _ := observation(t, p, "r", "a")
		if o.ExitCode == nil || *o.ExitCode != 128+15 || o.Signal != "SIGTERM" {
			t.Fatalf("after stop: %+v", o)
		}
	})

	t.Run("StopUnknown", func(t *testing.T) {
		t.Parallel()
		p := newProcess(t, t.TempDir())
		if err := p.Stop(context.Background(), api.StopWorkload{RunID: "r", AttemptID: "a"}); !errors.Is(err, ErrUnknownWorkload) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("InterruptedLaunchResumes", func(t *testing.T) {
		t.Parallel()
		// Simulate a crash between writing the record and spawning the
		// supervisor: the record exists, nothing else.
		p := newProcess(t, t.TempDir())
		ctx := context.Background()
		if err := p.Launch(ctx, api.LaunchWorkload{RunID: "r", AttemptID: "a", Command: "sh", Args: []string{"-c", "exit 5"}}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "exit", 20*time.Second, func() bool { o, _ := observation(t, p, "r", "a"); return o.State == api.WorkloadExited })
		d := p.attemptDir("r", "a")
		testwait.For(t, "the supervisor to exit", 20*time.Second, func() bool { return !lockHeld(d) })
		for _, f := range []string{fileShim, fileStatus, fileExit, fileStdout, fileStderr} {
			os.Remove(filepath.Join(d, f))
		}
		if err := p.Launch(ctx, api.LaunchWorkload{RunID: "r", AttemptID: "a"}); err != nil {
			t.Fatalf("resume: %v", err)
		}
		testwait.For(t, "exit", 20*time.Second, func() bool {
			o, _ := observation(t, p, "r", "a")
			return o.State == api.WorkloadExited && o.ExitCode != nil && *o.ExitCode == 5
		})
		if err := p.Launch(ctx, api.LaunchWorkload{RunID: "r", AttemptID: "a"}); !errors.Is(err, ErrWorkloadExists) {
			t.Fatalf("third launch = %v", err)
		}
		// The resumed supervisor may still be writing after the exit is
		// visible; the temp dir can only go once it has.
		testwait.For(t, "the resumed supervisor to exit", 20*time.Second, func() bool { return !lockHeld(d) })
	})
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func tarGz(t *testing.T, files map[string]string, extra ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	for _, h := range extra {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestArtifacts(t *testing.T) {
	image := tarGz(t, map[string]string{"bin/hello": "#!/bin/sh\necho hello from image\nexit 4\n"})
	bad := tarGz(t, nil, &tar.Header{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, &tar.Header{Name: "evil/x", Typeflag: tar.TypeReg, Size: 0, Mode: 0o644})
	var mu sync.Mutex
	hits := map[string]int{}
	hitsOf := func(p string) int { mu.Lock(); defer mu.Unlock(); return hits[p] }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		switch r.URL.Path {
		case "/image.tar.gz":
			w.Write(image)
		case "/bad.tar.gz":
			w.Write(bad)
		case "/text":
			w.Write([]byte("hello"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	ctx := context.Background()

	t.Run("DownloadVerifyAndIdempotent", func(t *testing.T) {
		p := newProcess(t, t.TempDir())
		msg, err := p.PrepareArtifact(ctx, api.PrepareArtifact{ArtifactID: "img-1", URL: srv.URL + "/image.tar.gz", SHA256: "sha256:" + sha(image)})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, sha(image)) {
			t.Fatalf("account %q does not name the digest", msg)
		}
		b, err := os.ReadFile(p.blobPath(sha(image)))
		if err != nil || !bytes.Equal(b, image) {
			t.Fatalf("cached blob wrong: %v", err)
		}
		before := hitsOf("/image.tar.gz")
		if _, err := p.PrepareArtifact(ctx, api.PrepareArtifact{ArtifactID: "img-1", URL: srv.URL + "/image.tar.gz", SHA256: sha(image)}); err != nil {
			t.Fatal(err)
		}
		if hitsOf("/image.tar.gz") != before {
			t.Fatal("a cached artifact was downloaded again")
		}

		msg, err = p.PrepareImage(ctx, api.PrepareImage{Image: "hello:1", ArtifactID: "img-1"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, "1 files") {
			t.Fatalf("unpack account %q", msg)
		}
		if _, err := p.PrepareImage(ctx, api.PrepareImage{Image: "hello:1"}); err != nil {
			t.Fatalf("re-prepare by name: %v", err)
		}
		if err := p.Launch(ctx, api.LaunchWorkload{RunID: "r", AttemptID: "a", Image: "hello:1", Command: "hello"}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "exit", 20*time.Second, func() bool {
			o, _ := observation(t, p, "r", "a")
			return o.State == api.WorkloadExited && o.ExitCode != nil && *o.ExitCode == 4
		})
		out, _ := os.ReadFile(filepath.Join(p.attemptDir("r", "a"), fileStdout))
		if string(out) != "hello from image\n" {
			t.Fatalf("stdout %q", out)
		}
	})

	t.Run("MismatchRefusedNamingBoth", func(t *testing.T) {
		p := newProcess(t, t.TempDir())
		want := strings.Repeat("ab", 32)
		_, err := p.PrepareArtifact(ctx, api.PrepareArtifact{ArtifactID: "t", URL: srv.URL + "/text", SHA256: want})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), sha([]byte("hello"))) {
			t.Fatalf("err = %v", err)
		}
		if _, err := os.Stat(p.blobPath(want)); err == nil {
			t.Fatal("mismatched bytes were cached")
		}
		if _, err := p.PrepareImage(ctx, api.PrepareImage{Image: "x", ArtifactID: "t"}); err == nil {
			t.Fatal("image from an unprepared artifact")
		}
	})

	t.Run("UnpackRefusesEscape", func(t *testing.T) {
		p := newProcess(t, t.TempDir())
		if _, err := p.PrepareArtifact(ctx, api.PrepareArtifact{ArtifactID: "bad", URL: srv.URL + "/bad.tar.gz", SHA256: sha(bad)}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.PrepareImage(ctx, api.PrepareImage{Image: "bad", ArtifactID: "bad"}); err == nil {
			t.Fatal("an archive writing through a symlink was unpacked")
		}
	})

	t.Run("DownloadErrorRefused", func(t *testing.T) {
		p := newProcess(t, t.TempDir())
		if _, err := p.PrepareArtifact(ctx, api.PrepareArtifact{ArtifactID: "m", URL: srv.URL + "/missing", SHA256: sha(nil)}); err == nil {
			t.Fatal("404 accepted")
		}
	})
}
