package core

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hookApplyEnv carries an apply attempt's id to its hook.
const hookApplyEnv = "NODEWARD_CONFIG_APPLY_ID="

// hookKillWait bounds how long a restart waits for a left-over hook to go.
const hookKillWait = 5 * time.Second

// killHookGroups kills the process groups of a config hook started for the
// apply attempt applyID that still run — a previous life of the agent
// started them and died without them (kill -9, a crash; KillMode=process
// spares them) — and waits up to wait for them to be gone. It answers how
// many groups it killed. A group qualifies when its leader (pid == pgid,
// as the hook's own group is) carries the id in its environment and is not
// a session leader: the hook runs in the agent's session, a daemon it
// started with setsid is not the hook's to kill. The id is random per
// attempt, so a reused pid never qualifies. Without /proc nothing is found.
func killHookGroups(applyID string, wait time.Duration) int {
	if applyID == "" {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	marker := []byte(hookApplyEnv + applyID)
	var groups []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !hasEnvEntry(env, marker) {
			continue
		}
		pgrp, sid, ok := procGroup(e.Name())
		if ok && pgrp == pid && sid != pid {
			groups = append(groups, pid)
		}
	}
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGKILL)
	}
	deadline := time.Now().Add(wait)
	for _, g := range groups {
		for groupAlive(g) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // the kernel reaps; there is nothing to wait on
		}
	}
	return len(groups)
}

// hasEnvEntry reports whether a /proc/PID/environ (NUL-separated) holds kv.
func hasEnvEntry(env, kv []byte) bool {
	for _, e := range bytes.Split(env, []byte{0}) {
		if bytes.Equal(e, kv) {
			return true
		}
	}
	return false
}

// procGroup reads a process's group and session from /proc/PID/stat.
func procGroup(pid string) (pgrp, sid int, ok bool) {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) state ppid pgrp session …"; comm may hold anything.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 4 {
		return 0, 0, false
	}
	pgrp, err1 := strconv.Atoi(f[2])
	sid, err2 := strconv.Atoi(f[3])
	return pgrp, sid, err1 == nil && err2 == nil
}

// groupAlive reports whether the process group still has a member.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
