package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

func open(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	t.Run("PrivateModes", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "st")
		s := open(t, dir, Options{})
		if err := s.SaveSession(Session{SessionToken: "tok", NodeID: "n"}); err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(dir)
		if fi.Mode().Perm() != 0o700 {
			t.Fatalf("dir mode %v", fi.Mode())
		}
		fi, _ = os.Stat(filepath.Join(dir, "session.json"))
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("session mode %v", fi.Mode())
		}
	})

	t.Run("OneAgentPerDir", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
			t.Fatalf("second open = %v", err)
		}
		s.Close()
		open(t, dir, Options{})
	})

	t.Run("LockWaitOutlastsABriefHolder", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		// Held for good: refused once the wait has passed.
		if _, err := Open(dir, Options{LockWait: 100 * time.Millisecond}); !errors.Is(err, ErrLocked) {
			t.Fatalf("open while held = %v", err)
		}
		// Released during the wait (as a killed agent's half-started child
		// lets go): taken.
		released := make(chan struct{})
		time.AfterFunc(200*time.Millisecond, func() { s.Close(); close(released) })
		s2, err := Open(dir, Options{LockWait: time.Minute})
		if err != nil {
			t.Fatalf("open after the holder let go = %v", err)
		}
		<-released
		s2.Close()
	})

	t.Run("SessionRoundTrip", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		if _, err := s.Session(); !errors.Is(err, ErrNoSession) {
			t.Fatalf("empty dir session = %v", err)
		}
		want := Session{SessionToken: "tok", NodeID: "n", FencingToken: 3, SessionTTLSeconds: 60, SessionExpiresAt: time.Unix(100, 0).UTC()}
		s.SaveSession(want)
		got, err := s.Session()
		if err != nil || got != want {
			t.Fatalf("got %+v, %v", got, err)
		}
		s.ClearSession()
		if _, err := s.Session(); !errors.Is(err, ErrNoSession) {
			t.Fatal("session survived ClearSession")
		}
	})

	t.Run("JournalSurvivesReopen", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		cmd := api.Command{OperationID: "op-1", Kind: api.KindLaunchWorkload, Payload: []byte(`{"run_id":"r"}`)}
		s.BeginOp(cmd)
		s.BeginOp(api.Command{OperationID: "op-2", Kind: api.KindStopWorkload})
		if err := s.FinishOp("op-1", api.Result{Applied: true}); err != nil {
			t.Fatal(err)
		}
		s.Close()

		s = open(t, dir, Options{})
		op, ok := s.Op("op-1")
		if !ok || op.State != OpDone || !op.Result.Applied || string(op.Payload) != `{"run_id":"r"}` {
			t.Fatalf("op-1 %+v", op)
		}
		if st := s.StartedOps(); len(st) != 1 || st[0].OperationID != "op-2" {
			t.Fatalf("started %+v", st)
		}
		owed := s.UnackedResults()
		if len(owed) != 1 || owed[0].OperationID != "op-1" {
			t.Fatalf("owed %+v", owed)
		}
		// A redelivery makes the answer a duplicate, owed again; an ack of
		// the answer as it was before does not settle the new one.
		res, err := s.Redelivered("op-1")
		if err != nil || !res.Duplicate {
			t.Fatalf("redelivered %+v %v", res, err)
		}
		s.AckResults(owed)
		if got := s.UnackedResults(); len(got) != 1 || !got[0].Duplicate {
			t.Fatalf("owed after stale ack %+v", got)
		}
		s.AckResults(s.UnackedResults())
		if got := s.UnackedResults(); len(got) != 0 {
			t.Fatalf("owed after ack %+v", got)
		}
	})

	t.Run("AckedRecordsPrunedAfterRetention", func(t *testing.T) {
		dir := t.TempDir()
		now := time.Unix(1000, 0)
		s := open(t, dir, Options{Now: func() time.Time { return now }, AckedRetention: time.Hour})
		s.BeginOp(api.Command{OperationID: "op-1"})
		s.FinishOp("op-1", api.Result{Applied: true})
		s.AckResults(s.UnackedResults())
		s.Close()
		now = now.Add(2 * time.Hour)
		s = open(t, dir, Options{Now: func() time.Time { return now }, AckedRetention: time.Hour})
		if _, ok := s.Op("op-1"); ok {
			t.Fatal("acked record kept past retention")
		}
	})

	t.Run("SpoolCapDropsHeartbeatsFirst", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{MaxEvents: 3})
		hb := func(i int) api.Event { return api.Event{ID: fmt.Sprintf("hb-%d", i), Kind: api.EventHeartbeat} }
		wl := func(i int) api.Event {
			return api.Event{ID: fmt.Sprintf("wl-%d", i), Kind: api.EventWorkload, Workload: &api.WorkloadObservation{RunID: "r"}}
		}
		for _, e := range []api.Event{hb(1), wl(1), hb(2), wl(2), wl(3)} {
			if err := s.AppendEvent(e); err != nil {
				t.Fatal(err)
			}
		}
		ids := func() []string {
			var out []string
			for _, e := range s.PendingEvents(100) {
				out = append(out, e.ID)
			}
			return out
		}
		if got := fmt.Sprint(ids()); got != "[wl-1 wl-2 wl-3]" {
			t.Fatalf("spool %s", got)
		}
		if err := s.AppendEvent(wl(4)); !errors.Is(err, ErrSpoolFull) {
			t.Fatalf("workload event into a full spool: %v", err)
		}
		if _, dropped := s.SpoolStats(); dropped != 2 {
			t.Fatalf("dropped %d heartbeats", dropped)
		}
		// Duplicate ids are one event.
		s.AppendEvent(wl(1))
		s.Close()
		s = open(t, dir, Options{MaxEvents: 3})
		if got := fmt.Sprint(ids()); got != "[wl-1 wl-2 wl-3]" {
			t.Fatalf("spool after reopen %s", got)
		}
		s.RemoveEvents([]string{"wl-1", "wl-3"})
		s.AppendEvent(wl(5))
		s.Close()
		s = open(t, dir, Options{MaxEvents: 3})
		if got := fmt.Sprint(ids()); got != "[wl-2 wl-5]" {
			t.Fatalf("spool order after reopen %s", got)
		}
	})

	t.Run("Reported", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		s.SetReported("r/a", "running")
		s.Close()
		s = open(t, dir, Options{})
		if s.Reported("r/a") != "running" {
			t.Fatal("reported state lost")
		}
	})
}
