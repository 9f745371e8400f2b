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
	"text/tabwriter"
	"time"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/internal/memorypolicy"
	"github.com/nodeward/nodeward/models"
)

// Version is set at build time with -ldflags "-X ...controlplane.Version=...".
var Version = "dev"

// subcommand describes one command for the help texts.
type subcommand struct {
	name     string // as typed: "token create"
	synopsis string // its own flags
	summary  string // one line
}

var (
	cmdServe   = subcommand{"serve", "", "serve the control plane (the default command)"}
	cmdMigrate = subcommand{"migrate", "", "apply database migrations and exit"}
	cmdAdmin   = subcommand{"admin create", "--username U --password-stdin", "create an administrator (through the running server, if any)"}
	// The way back in when every administrator is locked out, and the way
	// to lock one out from the machine.
	cmdAdminPassword = subcommand{"admin password", "--username U --password-stdin", "set an administrator's password; ends their console sessions"}
	cmdAdminDisable  = subcommand{"admin disable", "--username U", "disable an administrator: no sign-in, sessions ended, API tokens refused"}
	cmdAdminEnable   = subcommand{"admin enable", "--username U", "enable a disabled administrator again"}
	cmdAdminList     = subcommand{"admin list", "", "list administrators: created, disabled, open console sessions"}
	cmdToken         = subcommand{"token create", "--name N [--username U]", "print a new API token (through the running server, if any)"}
	cmdKeygen        = subcommand{"keygen", "--master-key-file F [--force]", "write a new master key file (mode 0600)"}
	cmdVersion       = subcommand{"version", "", "print the version"}
	cmdHelp          = subcommand{"help", "[command]", "show this list, or a command's flags"}
	commands         = []subcommand{cmdServe, cmdMigrate, cmdAdmin, cmdAdminPassword, cmdAdminDisable, cmdAdminEnable, cmdAdminList,
		cmdToken, cmdKeygen, cmdVersion, cmdHelp}
)

// usage is the top-level help: every command, one line each.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: nodeward [command] [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-47s %s\n", strings.TrimSpace(c.name+" "+c.synopsis), c.summary)
	}
	b.WriteString("\nserve, migrate, admin and token take the same configuration flags and\n" +
		"NODEWARD_* variables; \"nodeward COMMAND --help\" lists a command's flags.\n")
	return b.String()
}

// Main runs the server binary with args (without the program name) and
// returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (!strings.HasPrefix(args[0], "-") || isHelp(args[0])) {
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
	case "keygen":
		err = runKeygen(args, stdout, stderr)
	case "version":
		if len(args) > 0 && isHelp(args[0]) {
			printHelp(stdout, cmdVersion, nil)
			return 0
		}
		fmt.Fprintln(stdout, versionString())
	case "help", "-h", "-help", "--help":
		if cmd == "help" && len(args) > 0 && !isHelp(args[0]) {
			// "help token" is "token --help".
			return Main([]string{args[0], "--help"}, stdin, stdout, stderr)
		}
		fmt.Fprint(stdout, usage())
	default:
		fmt.Fprintf(stderr, "nodeward: unknown command %q\n\n%s", cmd, usage())
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

func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// printHelp writes a command's usage line, summary and flags (fs may be nil).
func printHelp(w io.Writer, c subcommand, fs *flag.FlagSet) {
	if fs == nil {
		fmt.Fprintf(w, "usage: nodeward %s\n\n%s\n", strings.TrimSpace(c.name+" "+c.synopsis), c.summary)
		return
	}
	fmt.Fprintf(w, "usage: nodeward %s\n\n%s\n", strings.TrimSpace(c.name+" "+c.synopsis+" [flags]"), c.summary)
	fmt.Fprint(w, "\nflags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
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

// parseFlags parses args into fs; -h prints c's help on stdout and answers
// flag.ErrHelp.
func parseFlags(c subcommand, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	// The flag package's own messages are replaced by ours: help on stdout,
	// errors as one line.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, c, fs)
			return err
		}
		return usageError{fmt.Sprintf("%v (see nodeward %s --help)", err, c.name)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q (see nodeward %s --help)", fs.Arg(0), c.name)}
	}
	return nil
}

// parseConfig parses the common flags (plus extra ones the caller declared).
func parseConfig(c subcommand, args []string, stdout io.Writer, extra func(fs *flag.FlagSet)) (Config, error) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	var cfg Config
	bindFlags(fs, &cfg, os.Getenv)
	if extra != nil {
		extra(fs)
	}
	return cfg, parseFlags(c, fs, args, stdout)
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
	cfg, err := parseConfig(cmdServe, args, stdout, nil)
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
	if _, err := app.ListenDebug(); err != nil {
		_ = ln.Close()
		return err
	}
	app.announce(ctx, ln.Addr().String())
	// The collector's headroom follows the live heap (internal/memorypolicy)
	// unless the operator set GOGC or GOMEMLIMIT, or turned it off. One per
	// process: only the served binary runs it, not tests or the load tool's
	// servers.
	policyCtx, stopPolicy := context.WithCancel(ctx)
	policyDone := make(chan struct{})
	go func() {
		defer close(policyDone)
		memorypolicy.Run(policyCtx, memorypolicy.Options{Log: log})
	}()
	defer func() { stopPolicy(); <-policyDone }()
	return app.Serve(ctx, ln)
}

// announce logs where the server listens and how the first administrator
// gets in.
func (a *App) announce(ctx context.Context, addr string) {
	db := "sqlite:" + a.DB.Path
	if a.DB.Dialect != "sqlite" {
		db = "postgres"
	}
	attrs := []any{"addr", addr, "public_url", a.Config.PublicURL,
		"console", a.Config.PublicURL + "/console/", "database", db, "replica", a.Config.ReplicaID, "version", versionString()}
	if a.Config.TrustedProxies != "" {
		// Whose X-Forwarded-For names the client: worth seeing at a glance.
		attrs = append(attrs, "trusted_proxies", a.Config.TrustedProxies)
	}
	a.Log.Info("listening", attrs...)
	tok, err := a.Auth.OpenSetup(ctx)
	if err != nil {
		a.Log.Error("first-run setup", "err", err)
		return
	}
	if tok != "" {
		// The setup link is printed once, on this process's log only; it is
		// spent by creating the first administrator.
		// The command line needs no server stopped: on SQLite it goes
		// through the administrative socket, on PostgreSQL to the database.
		a.Log.Warn("no administrator yet: open this one-time link to create the first one, "+
			"or run this binary's `admin create --username NAME --password-stdin` with the same data folder or database "+
			"(from a checkout: `go run ./server admin create ...`)",
			"setup_url", a.Config.PublicURL+"/console/setup#"+tok)
	}
}

func runMigrate(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(cmdMigrate, args, stdout, nil)
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
	if len(args) > 0 && isHelp(args[0]) {
		args = []string{"create", "--help"}
	}
	const usage = "usage: nodeward admin create|password|disable|enable|list ... (see nodeward admin create --help)"
	if len(args) == 0 {
		return usageError{usage}
	}
	var (
		c         subcommand
		username  string
		fromStdin bool
	)
	switch args[0] {
	case "create":
		c = cmdAdmin
	case "password":
		c = cmdAdminPassword
	case "disable":
		c = cmdAdminDisable
	case "enable":
		c = cmdAdminEnable
	case "list":
		c = cmdAdminList
	default:
		return usageError{usage}
	}
	cfg, err := parseConfig(c, args[1:], stdout, func(fs *flag.FlagSet) {
		if c == cmdAdminList {
			return
		}
		fs.StringVar(&username, "username", "", "the administrator's username")
		if c == cmdAdmin || c == cmdAdminPassword {
			fs.BoolVar(&fromStdin, "password-stdin", false, "read the password from the first line of standard input")
		}
	})
	if err != nil {
		return err
	}
	var password string
	switch {
	case c == cmdAdminList:
	case c == cmdAdmin || c == cmdAdminPassword:
		if username == "" || !fromStdin {
			return usageError{c.name + " needs --username and --password-stdin (passwords are never taken as arguments)"}
		}
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read password: %w", err)
		}
		password = strings.TrimRight(line, "\r\n")
	case username == "":
		return usageError{c.name + " needs --username"}
	}
	if c == cmdAdminList {
		// Logs go to stderr at warn so stdout carries the listing only.
		cfg.LogLevel = "warn"
	}
	ops, done, err := openAdminOps(cfg, stderr, c == cmdAdmin)
	if err != nil {
		return err
	}
	defer done()
	ctx := context.Background()
	switch c {
	case cmdAdmin:
		name, err := ops.createAdmin(ctx, username, password)
		if err != nil {
			return describe(err)
		}
		fmt.Fprintf(stdout, "created administrator %s\n", name)
	case cmdAdminPassword:
		n, disabled, err := ops.resetPassword(ctx, username, password)
		if err != nil {
			return describe(err)
		}
		fmt.Fprintf(stdout, "set the password of administrator %s (%s)\n", username, sessionsEnded(n))
		if disabled {
			fmt.Fprintf(stderr, "nodeward: %s is disabled and still cannot sign in: `admin enable --username %s` lets them\n", username, username)
		}
	case cmdAdminDisable, cmdAdminEnable:
		n, err := ops.setDisabled(ctx, username, c == cmdAdminDisable)
		if err != nil {
			return describe(err)
		}
		if c == cmdAdminDisable {
			fmt.Fprintf(stdout, "administrator %s is disabled (%s; their API tokens are refused until enabled)\n", username, sessionsEnded(n))
		} else {
			fmt.Fprintf(stdout, "administrator %s is enabled\n", username)
		}
	case cmdAdminList:
		rows, err := ops.listAdmins(ctx)
		if err != nil {
			return describe(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "USERNAME\tCREATED\tSTATE\tCONSOLE SESSIONS")
		for _, r := range rows {
			state := "enabled"
			if r.DisabledAt != nil {
				state = "disabled " + r.DisabledAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", r.Username, r.CreatedAt.UTC().Format(time.RFC3339), state, r.LiveSessions)
		}
		return tw.Flush()
	}
	return nil
}

func sessionsEnded(n int64) string {
	if n == 1 {
		return "1 console session ended"
	}
	return fmt.Sprintf("%d console sessions ended", n)
}

func runToken(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isHelp(args[0]) {
		args = []string{"create", "--help"}
	}
	if len(args) == 0 || args[0] != "create" {
		return usageError{"usage: nodeward token create --name N [--username U] (see nodeward token create --help)"}
	}
	var name, username string
	cfg, err := parseConfig(cmdToken, args[1:], stdout, func(fs *flag.FlagSet) {
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
	ops, done, err := openAdminOps(cfg, stderr, false)
	if err != nil {
		return err
	}
	defer done()
	tok, owner, err := ops.createToken(context.Background(), username, name)
	if err != nil {
		return describe(err)
	}
	if username == "" {
		// Nobody asked for an owner: say whose token this is.
		fmt.Fprintf(stderr, "nodeward: the token belongs to administrator %s, the oldest enabled one (choose with --username)\n", owner)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// openAdminOps reaches the server holding cfg's SQLite data folder through
// its administrative socket, or else opens the database itself (always so on
// PostgreSQL); a SQLite folder without a database is refused unless the
// command creates one. done releases what it opened.
func openAdminOps(cfg Config, stderr io.Writer, creates bool) (ops adminOps, done func(), err error) {
	if cfg.DatabaseURL == "" && cfg.DataDir != "" {
		if c, ok := dialSocket(cfg.DataDir); ok {
			return c, func() {}, nil
		}
		// Only `admin create` may start a database: anything else against
		// a folder without one is a mistyped --data-dir, which must not
		// leave a fresh database and master key behind.
		if _, err := os.Stat(models.SQLiteFile(cfg.DataDir)); !creates && errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("no Nodeward database in %s: is --data-dir (NODEWARD_DATA_DIR) right? (`admin create` starts one)", cfg.DataDir)
		}
	}
	app, err := Open(context.Background(), cfg, newLogger(cfg, stderr))
	if errors.Is(err, models.ErrDataDirLocked) {
		return nil, nil, fmt.Errorf("%w, and its administrative socket %s does not answer", err, SocketPath(cfg.DataDir))
	}
	if err != nil {
		return nil, nil, err
	}
	return direct{app.Auth}, func() { _ = app.Close() }, nil
}

func runKeygen(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmdKeygen.name, flag.ContinueOnError)
	path := fs.String("master-key-file", os.Getenv("NODEWARD_MASTER_KEY_FILE"), "file to write the new master key to (NODEWARD_MASTER_KEY_FILE)")
	force := fs.Bool("force", false, "replace an existing file (every credential signed with its keys stops verifying)")
	if err := parseFlags(cmdKeygen, fs, args, stdout); err != nil {
		return err
	}
	if *path == "" {
		return usageError{"keygen needs --master-key-file or NODEWARD_MASTER_KEY_FILE"}
	}
	if _, err := writeNewKey(*path, *force); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote a new master key to %s (mode 0600): back it up, and give every replica the same file\n", *path)
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
