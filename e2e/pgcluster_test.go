package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pgCluster is a throwaway PostgreSQL cluster the suite starts itself
// (initdb in a temp dir, run as the postgres OS user when the tests run as
// root): the one Postgres the suite may stop, crash and restart
// (DECISIONS §29). The shared test server is never touched.
type pgCluster struct {
	dir, data, port string
	asUser          string // "" runs the tools as ourselves
	t               testing.TB
}

// startPGCluster initdbs and starts a private cluster on a free loopback
// port; it skips the test when the server tools are absent (CI=true fails).
func startPGCluster(t testing.TB) *pgCluster {
	t.Helper()
	if _, err := exec.LookPath("initdb"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("initdb not found: CI must run the Postgres restart test")
		}
		t.Skip("initdb not found: the Postgres restart test needs the server tools")
	}
	dir, err := os.MkdirTemp("", "nodeward-pg-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755)
	c := &pgCluster{dir: dir, data: filepath.Join(dir, "data"), t: t}
	_, port, _ := net.SplitHostPort(FreeAddr(t))
	c.port = port
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root without a postgres OS user to run initdb as")
		}
		c.asUser = "postgres"
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = c.ctl("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	if out, err := c.tool("initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("port = %s\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nmax_connections = 60\nshared_buffers = 16MB\n", c.port, dir)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(conf)
	_ = f.Close()
	c.Start()
	return c
}

// URL answers a connection URL for the cluster's postgres database.
func (c *pgCluster) URL() string {
	return "postgres://postgres@127.0.0.1:" + c.port + "/postgres?sslmode=disable"
}

func (c *pgCluster) tool(name string, args ...string) *exec.Cmd {
	if c.asUser != "" {
		return exec.Command("runuser", append([]string{"-u", c.asUser, "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

func (c *pgCluster) ctl(args ...string) error {
	all := append([]string{"-D", c.data, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60"}, args...)
	out, err := c.tool("pg_ctl", all...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Start starts the cluster and waits until it accepts connections.
func (c *pgCluster) Start() {
	c.t.Helper()
	if err := c.ctl("start"); err != nil {
		c.t.Fatal(err)
	}
}

// Crash stops the cluster the way a power cut would (immediate mode: no
// checkpoint, crash recovery at the next start).
func (c *pgCluster) Crash() {
	c.t.Helper()
	if err := c.ctl("stop", "-m", "immediate"); err != nil {
		c.t.Fatal(err)
	}
}
