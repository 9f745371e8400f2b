package core

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestKillHookGroupsKillsOnlyTheLeftOverHook: a restart kills the process
// group of a hook its previous life left running for the interrupted
// attempt — the hook and its children — and nothing else: not a hook of
// another attempt, not a daemon a hook started in a session of its own.
func TestKillHookGroupsKillsOnlyTheLeftOverHook(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc")
	}
	start := func(applyID string, attr *syscall.SysProcAttr) *exec.Cmd {
		t.Helper()
		// The child sleep stays in the shell's group; exec would replace it.
		cmd := exec.Command("sh", "-c", "sleep 60; true")
		cmd.Env = append(os.Environ(), hookApplyEnv+applyID)
		cmd.SysProcAttr = attr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
		return cmd
	}
	left := start("attempt-a", &syscall.SysProcAttr{Setpgid: true})
	other := start("attempt-b", &syscall.SysProcAttr{Setpgid: true})
	daemon := start("attempt-a", &syscall.SysProcAttr{Setsid: true})

	done := make(chan int, 1)
	go func() { done <- killHookGroups("attempt-a", 10*time.Second) }()
	// The test is the hook's parent: reaping it ends the group's life.
	err := left.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("left-over hook ended %v, want killed", err)
	}
	select {
	case n := <-done:
		if n != 1 {
			t.Fatalf("killed %d groups, want 1", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("killHookGroups did not return")
	}
	if groupAlive(left.Process.Pid) {
		t.Fatal("the hook's child outlived its group's kill")
	}
	for name, c := range map[string]*exec.Cmd{"another attempt's hook": other, "a daemon in its own session": daemon} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("%s was killed: %v", name, err)
		}
	}
	if n := killHookGroups("", time.Second); n != 0 {
		t.Fatalf("an empty id killed %d groups", n)
	}
}
