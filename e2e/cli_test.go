package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCLIBesideRunningServer: on SQLite, `admin create` and `token create`
// work while the server binary runs (through its socket), and still work,
// on the database itself, after the server was killed outright and left its
// socket file behind.
func TestCLIBesideRunningServer(t *testing.T) {
	s := StartServer(t, ServerOptions{Token: "none yet"}) // no administrator before the server runs
	sock := filepath.Join(s.DataDir, "nodeward.sock")
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v %v", sock, fi, err)
	}

	if out := s.run(t, strings.NewReader("e2e-admin-password\n"), "admin", "create", "--username", "ops", "--password-stdin"); out != "created administrator ops\n" {
		t.Fatalf("admin create: %q", out)
	}
	s.Token = strings.TrimSpace(s.run(t, nil, "token", "create", "--name", "while-serving"))
	var who struct{ Username string }
	s.API(t, "GET", "/api/v1/whoami", nil, 200, &who)
	if who.Username != "ops" {
		t.Fatalf("whoami: %+v", who)
	}

	s.Stop(t, syscall.SIGKILL)
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("a killed server leaves its socket: %v", err)
	}
	s.Token = strings.TrimSpace(s.run(t, nil, "token", "create", "--name", "after-kill"))
	s.Start(t)
	s.API(t, "GET", "/api/v1/whoami", nil, 200, &who)
	s.Token = strings.TrimSpace(s.run(t, nil, "token", "create", "--name", "after-restart"))
	s.API(t, "GET", "/api/v1/whoami", nil, 200, &who)
}
