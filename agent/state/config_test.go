package state

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

func TestConfigFiles(t *testing.T) {
	t.Run("WrittenPrivateWithMeta", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		if _, err := s.ConfigMeta(); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("meta before any: %v", err)
		}
		path, err := s.WriteConfig(api.ConfigDelivery{Revision: 3, Hash: "abc", Format: "f/v1", Document: json.RawMessage(` {"k":"v"} `)})
		if err != nil {
			t.Fatal(err)
		}
		if path != filepath.Join(s.Dir(), "config", "current.json") || path != s.ConfigPath() {
			t.Fatalf("path %s", path)
		}
		b, _ := os.ReadFile(path)
		if string(b) != "{\"k\":\"v\"}\n" {
			t.Fatalf("document %q", b)
		}
		m, err := s.ConfigMeta()
		if err != nil || m != (ConfigMeta{Revision: 3, Hash: "abc", Format: "f/v1"}) {
			t.Fatalf("meta %+v %v", m, err)
		}
		for _, p := range []string{path, s.Path("config", "current.meta.json")} {
			fi, err := os.Stat(p)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v %v", p, fi.Mode(), err)
			}
		}
		if fi, _ := os.Stat(s.Path("config")); fi.Mode().Perm() != 0o700 {
			t.Fatalf("config dir mode %v", fi.Mode())
		}
	})

	t.Run("ClearedRemovesTheDocument", func(t *testing.T) {
		s := open(t, t.TempDir(), Options{})
		s.WriteConfig(api.ConfigDelivery{Revision: 1, Hash: "a", Document: json.RawMessage(`{}`)})
		path, err := s.WriteConfig(api.ConfigDelivery{Revision: 2, Hash: "b", Document: json.RawMessage(`null`)})
		if err != nil || path != "" {
			t.Fatalf("path %q, %v", path, err)
		}
		if _, err := os.Stat(s.ConfigPath()); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("document kept: %v", err)
		}
		if m, _ := s.ConfigMeta(); m.Revision != 2 || m.Hash != "b" {
			t.Fatalf("meta %+v", m)
		}
		// Clearing twice is no error.
		if _, err := s.WriteConfig(api.ConfigDelivery{Revision: 2, Hash: "b"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("StatusSurvivesReopen", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, Options{})
		if _, ok, err := s.ConfigStatus(); ok || err != nil {
			t.Fatalf("status before any: %v %v", ok, err)
		}
		want := ConfigStatus{Revision: 4, Hash: "h", Format: "f", State: ConfigApplying, Attempt: 1, At: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
		if err := s.SetConfigStatus(want); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s = open(t, dir, Options{})
		got, ok, err := s.ConfigStatus()
		if !ok || err != nil || got != want {
			t.Fatalf("status %+v %v %v", got, ok, err)
		}
	})

	t.Run("IsCleared", func(t *testing.T) {
		for doc, want := range map[string]bool{"": true, "null": true, " null\n": true, "{}": false, `"null"`: false, "0": false} {
			if IsCleared([]byte(doc)) != want {
				t.Errorf("IsCleared(%q) != %v", doc, want)
			}
		}
	})

	t.Run("SpoolNeverDropsConfigReports", func(t *testing.T) {
		s := open(t, t.TempDir(), Options{MaxEvents: 2})
		cfg := func(id string) api.Event {
			return api.Event{ID: id, Kind: api.EventConfig, Config: &api.ConfigReport{Revision: 1, Hash: "h", State: api.ConfigApplied}}
		}
		for _, e := range []api.Event{cfg("c1"), {ID: "hb", Kind: api.EventHeartbeat}, cfg("c2")} {
			if err := s.AppendEvent(e); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AppendEvent(cfg("c3")); !errors.Is(err, ErrSpoolFull) {
			t.Fatalf("config report into a full spool: %v", err)
		}
		ev := s.PendingEvents(10)
		if len(ev) != 2 || ev[0].ID != "c1" || ev[1].ID != "c2" {
			t.Fatalf("spool %+v", ev)
		}
	})
}
