package controlplane

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/nodeward/nodeward/errcode"
)

// Version is set at build time with -ldflags "-X ...controlplane.Version=...".
var Version = "dev"

const usage = `usage: nodeward [command] [flags]

commands:
  serve                                        serve the control plane (default)
  migrate                                      apply database migrations and exit
  admin create --username U --password-stdin   create an administrator
  token create --name N [--username U]         print a new administrator API token
  version                                      print the version

Every command takes the same configuration flags and NODEWARD_* variables;
run "nodeward serve -h" to list them.
`

// Main runs the server binary with args (without the program name) and
// returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = runServe(args, stdout, stderr)
	case "migrate":
		err = runMigrate(args, stdout, stderr)
	case "admin":
		err = runAdmin(args, stdin, stdout, stderr)
	case "token":
		err = runToken(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, versionString())
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "nodeward: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "nodeward: %v\n", err)
			return 2
		}
		fmt.Fprintf(stderr, "nodeward: %v\n", err)
		return 1
	}
	return 0
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func versionString() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return "nodeward " + v
}

// parseConfig parses the common flags (plus extra ones the caller declared).
func parseConfig(name string, args []string, stderr io.Writer, extra func(fs *flag.FlagSet)) (Config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c Config
	bindFlags(fs, &c, os.Getenv)
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return c, usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return c, nil
}

func newLogger(c Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func runServe(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig("serve", args, stderr, nil)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app, err := Open(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer app.Close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	app.announce(ctx, ln.Addr().String())
	return app.Serve(ctx, ln)
}

// announce logs where the server listens and how the first administrator
// gets in.
func (a *App) announce(ctx context.Context, addr string) {
	db := "sqlite:" + a.DB.Path
	if a.DB.Dialect != "sqlite" {
		db = "postgres"
	}
	a.Log.Info("listening", "addr", addr, "public_url", a.Config.PublicURL,
		"console", a.Config.PublicURL+"/console/", "database", db, "replica", a.Config.ReplicaID, "version", versionString())
	tok, err := a.Auth.OpenSetup(ctx)
	if err != nil {
		a.Log.Error("first-run setup", "err", err)
		return
	}
	if tok != "" {
		// The setup link is printed once, on this process's log only; it is
		// spent by creating the first administrator.
		a.Log.Warn("no administrator yet: open this one-time link to create the first one, "+
			"or stop the server and run `nodeward admin create --username NAME --password-stdin`",
			"setup_url", a.Config.PublicURL+"/console/setup#"+tok)
	}
}

func runMigrate(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig("migrate", args, stderr, nil)
	if err != nil {
		return err
	}
	app, err := Open(context.Background(), cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	defer app.Close()
	fmt.Fprintln(stdout, "migrations applied")
	return nil
}

func runAdmin(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		return usageError{"usage: nodeward admin create --username U --password-stdin"}
	}
	var username string
	var fromStdin bool
	cfg, err := parseConfig("admin create", args[1:], stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&username, "username", "", "the administrator's username")
		fs.BoolVar(&fromStdin, "password-stdin", false, "read the password from the first line of standard input")
	})
	if err != nil {
		return err
	}
	if username == "" || !fromStdin {
		return usageError{"admin create needs --username and --password-stdin (passwords are never taken as arguments)"}
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read password: %w", err)
	}
	password := strings.TrimRight(line, "\r\n")
	app, err := Open(context.Background(), cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	defer app.Close()
	u, err := app.Auth.CreateAdmin(context.Background(), username, password)
	if err != nil {
		return describe(err)
	}
	fmt.Fprintf(stdout, "created administrator %s\n", u.Username)
	return nil
}

func runToken(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "create" {
		return usageError{"usage: nodeward token create --name N [--username U]"}
	}
	var name, username string
	cfg, err := parseConfig("token create", args[1:], stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "name", "", "what the token is for")
		fs.StringVar(&username, "username", "", "owner (default: the first administrator)")
	})
	if err != nil {
		return err
	}
	if name == "" {
		return usageError{"token create needs --name"}
	}
	// Logs go to stderr at warn so stdout carries the token and nothing else.
	cfg.LogLevel = "warn"
	app, err := Open(context.Background(), cfg, newLogger(cfg, stderr))
	if err != nil {
		return err
	}
	defer app.Close()
	ctx := context.Background()
	if username == "" {
		u, err := app.Auth.FirstAdmin(ctx)
		if err != nil {
			return describe(err)
		}
		username = u.Username
	}
	tok, _, err := app.Auth.CreateTokenFor(ctx, username, name)
	if err != nil {
		return describe(err)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// describe turns a domain error into one line, with field details.
func describe(err error) error {
	var e *errcode.Error
	if errors.As(err, &e) && len(e.Fields) > 0 {
		parts := make([]string, 0, len(e.Fields))
		for _, f := range e.Fields {
			parts = append(parts, f.Field+": "+f.Message)
		}
		return errors.New(strings.Join(parts, "; "))
	}
	return err
}
