// Command nodeward-agent is the Nodeward node agent: it enrolls once with the
// bootstrap its invitation answered, then long-polls the control plane over
// HTTPS for commands and applies each exactly once. It listens on nothing.
//
//	nodeward-agent --bootstrap bootstrap.json --state-dir /var/lib/nodeward-agent
//
// Exit status: 0 after SIGTERM/SIGINT or after the node was retired (its
// workloads stopped and their exits delivered); 2 when the node needs a
// reinvite (fenced, session invalid, enrollment refused); 1 for anything else
// (bad flags, unreadable state). `nodeward-agent shim` is the hidden
// workload supervisor the agent re-executes itself as.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/core"
	"github.com/nodeward/nodeward/agent/runtime"
	"github.com/nodeward/nodeward/agent/state"
)

// version is set at build time: -ldflags "-X main.version=1.2.3".
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		os.Exit(runtime.ShimMain(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

type labelsFlag map[string]string

func (l labelsFlag) String() string { return fmt.Sprint(map[string]string(l)) }
func (l labelsFlag) Set(v string) error {
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return fmt.Errorf("label %q is not key=value", kv)
		}
		l[k] = val
	}
	return nil
}

func run(args []string) int {
	fs := flag.NewFlagSet("nodeward-agent", flag.ContinueOnError)
	bootstrap := fs.String("bootstrap", os.Getenv("NODEWARD_AGENT_BOOTSTRAP"), "bootstrap JSON file, or - for stdin (env NODEWARD_AGENT_BOOTSTRAP: a path or the JSON itself); not needed once a session is stored")
	stateDir := fs.String("state-dir", envOr("NODEWARD_AGENT_STATE_DIR", "/var/lib/nodeward-agent"), "state directory (env NODEWARD_AGENT_STATE_DIR)")
	insecure := fs.Bool("allow-insecure-http", false, "allow a plain http control plane URL, only to a loopback host (127.0.0.0/8, ::1, localhost)")
	rtName := fs.String("runtime", "process", "workload runtime: process or simulated")
	labels := labelsFlag{}
	fs.Var(labels, "label", "node label key=value (repeatable, or comma separated; env NODEWARD_AGENT_LABELS)")
	pollWait := fs.Duration("poll-wait", 25*time.Second, "long-poll wait asked of the control plane (1s-60s; from 5s up, each poll asks up to a fifth less, at random, so a fleet's polls spread)")
	retireGrace := fs.Duration("retire-grace", 10*time.Second, "SIGTERM grace for workloads when the node is retired")
	configHook := fs.String("config-hook", os.Getenv("NODEWARD_AGENT_CONFIG_HOOK"), "program run after the desired configuration is written: split on white space (no shell), the document's path appended (\"\" when cleared) (env NODEWARD_AGENT_CONFIG_HOOK)")
	hookTimeout := 60 * time.Second
	if v := os.Getenv("NODEWARD_AGENT_CONFIG_HOOK_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "nodeward-agent: NODEWARD_AGENT_CONFIG_HOOK_TIMEOUT=%q is not a positive duration\n", v)
			return 1
		}
		hookTimeout = d
	}
	fs.DurationVar(&hookTimeout, "config-hook-timeout", hookTimeout, "the config hook is killed (and the apply failed) after this long (env NODEWARD_AGENT_CONFIG_HOOK_TIMEOUT)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // asked for: the usage is printed
		}
		return 1 // not 2: that status means "needs a reinvite"
	}
	if *showVersion {
		fmt.Println(version)
		return 0
	}
	// Out-of-range settings are refused, not clamped: an agent quietly
	// polling differently from what its unit file says is worse than one
	// that does not start.
	switch {
	case *pollWait < time.Second || *pollWait > 60*time.Second:
		fmt.Fprintf(os.Stderr, "nodeward-agent: --poll-wait %s: want 1s to 60s (the control plane holds a poll at most 60s)\n", *pollWait)
		return 1
	case *retireGrace < 0 || *retireGrace > time.Hour:
		fmt.Fprintf(os.Stderr, "nodeward-agent: --retire-grace %s: want 0s to 1h\n", *retireGrace)
		return 1
	case *logFormat != "text" && *logFormat != "json":
		fmt.Fprintf(os.Stderr, "nodeward-agent: --log-format %q: want text or json\n", *logFormat)
		return 1
	}
	if env := os.Getenv("NODEWARD_AGENT_LABELS"); env != "" && len(labels) == 0 {
		if err := labels.Set(env); err != nil {
			fmt.Fprintln(os.Stderr, "nodeward-agent:", err)
			return 1
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "nodeward-agent: --log-level:", err)
		return 1
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, hopts)
	if *logFormat == "json" {
		h = slog.NewJSONHandler(os.Stderr, hopts)
	}
	log := slog.New(h)

	if hookTimeout <= 0 {
		log.Error("--config-hook-timeout must be positive")
		return 1
	}
	hook := strings.Fields(*configHook)
	if len(hook) > 0 {
		// Fail at start, not at the first delivery.
		if _, err := exec.LookPath(hook[0]); err != nil {
			log.Error("--config-hook", "err", err)
			return 1
		}
	}

	var b *api.Bootstrap
	if *bootstrap != "" {
		var err error
		if b, err = readBootstrap(*bootstrap); err != nil {
			log.Error("read bootstrap", "err", err)
			return 1
		}
	}
	// A few seconds for the lock: a restart right after a kill -9 may find
	// it held for an instant by a child the killed agent was starting.
	store, err := state.Open(*stateDir, state.Options{LockWait: 5 * time.Second})
	if err != nil {
		log.Error("open state dir", "err", err)
		return 1
	}
	defer store.Close()

	var rt runtime.Runtime
	switch *rtName {
	case "process":
		rt, err = runtime.NewProcess(runtime.ProcessOptions{StateDir: store.Dir(), Logger: log})
		if err != nil {
			log.Error("process runtime", "err", err)
			return 1
		}
	case "simulated":
		rt = runtime.NewSimulated()
	default:
		log.Error("unknown --runtime", "runtime", *rtName)
		return 1
	}

	agent, err := core.New(core.Config{
		Store:             store,
		Runtime:           rt,
		Bootstrap:         b,
		AllowInsecureHTTP: *insecure,
		Labels:            labels,
		Version:           version,
		Logger:            log,
		PollWait:          *pollWait,
		RetireGrace:       *retireGrace,
		ConfigHook:        hook,
		ConfigHookTimeout: hookTimeout,
	})
	if err != nil {
		log.Error("agent", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("nodeward-agent starting", "version", version, "state_dir", store.Dir(), "runtime", *rtName, "config_hook", strings.Join(hook, " "))
	err = agent.Run(ctx)
	var fe *core.FatalError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, core.ErrRetired):
		return 0
	case errors.As(err, &fe):
		log.Error("nodeward-agent stopped: reinvite needed", "code", fe.Code)
		return 2
	default:
		log.Error("nodeward-agent stopped", "err", err)
		return 1
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// readBootstrap reads the bootstrap from a file, stdin ("-"), or inline JSON
// (for the environment variable).
func readBootstrap(src string) (*api.Bootstrap, error) {
	var data []byte
	var err error
	switch {
	case src == "-":
		data, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	case strings.HasPrefix(strings.TrimSpace(src), "{"):
		data = []byte(src)
	default:
		data, err = os.ReadFile(src)
	}
	if err != nil {
		return nil, err
	}
	if err := problemAsBootstrap(data); err != nil {
		return nil, err
	}
	var b api.Bootstrap
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("bootstrap is not valid JSON: %w", err)
	}
	return &b, nil
}

// problemAsBootstrap recognizes an error answer saved in place of a
// bootstrap (an invitation that failed, e.g. curl -o without --fail), and
// says what went wrong and what to do rather than that fields are missing.
func problemAsBootstrap(data []byte) error {
	var p struct {
		api.Problem
		NodeID string `json:"node_id"`
	}
	if json.Unmarshal(data, &p) != nil || p.Code == "" || p.NodeID != "" {
		return nil
	}
	detail := p.Detail
	if detail == "" {
		detail = p.Title
	}
	var todo string
	switch p.Code {
	case "identity_exists":
		todo = "that rental_id and generation were invited before: invite with a new rental_id or a higher generation, or ask for POST /api/v1/nodes/{node_id}/reinvite"
	case "generation_stale":
		todo = "a higher generation of that rental_id exists: invite with a higher generation"
	case "unauthenticated", "permission_denied":
		todo = "the API token was refused: invite with a valid administrator token"
	default:
		todo = "fix what it says and invite again"
	}
	return fmt.Errorf("the bootstrap is an error answer from the control plane, not a bootstrap: the invitation failed "+
		"(code=%s status=%d detail=%q); %s, then start the agent with the new answer", p.Code, p.Status, detail, todo)
}
