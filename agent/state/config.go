package state

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// The desired configuration's files (DECISIONS.md §32), under <dir>/config/:
//
//	current.json       the document as delivered (absent once cleared)
//	current.meta.json  {revision, hash, format} of the last written revision
//	status.json        ConfigStatus: where the agent is in converging on it
const (
	ConfigDir      = "config"
	ConfigFile     = "current.json"
	ConfigMetaFile = "current.meta.json"
	configStatus   = "status.json"
)

// ConfigApplying is the ConfigStatus state written before the document is
// written and the apply hook runs; api.ConfigApplied or api.ConfigFailed
// replaces it once the outcome is known. A status still "applying" after a
// restart means the agent stopped (or was killed) mid-apply.
const ConfigApplying = "applying"

// ConfigMeta is what current.meta.json holds.
type ConfigMeta struct {
	Revision int64  `json:"revision"`
	Hash     string `json:"hash"`
	Format   string `json:"format"`
}

// ConfigStatus is the agent's durable record of the last configuration
// revision it wrote: the revision it remembers as applied (State
// api.ConfigApplied), failed, or still being applied (ConfigApplying).
type ConfigStatus struct {
	Revision int64  `json:"revision"`
	Hash     string `json:"hash"`
	Format   string `json:"format"`
	// Cleared: the revision carries no document (current.json removed).
	Cleared bool   `json:"cleared,omitempty"`
	State   string `json:"state"`
	// Attempt counts the applies begun for this revision since it was last
	// delivered: 1 for the first, 2 for the one re-run after an interrupted
	// first. It bounds re-runs after crashes.
	Attempt int `json:"attempt,omitempty"`
	// ApplyID names one apply attempt; its hook runs with it in
	// NODEWARD_CONFIG_APPLY_ID, so that a restart finds a hook the agent's
	// previous life left running (KillMode=process keeps it alive).
	ApplyID string    `json:"apply_id,omitempty"`
	Message string    `json:"message,omitempty"`
	At      time.Time `json:"at"`
}

// IsCleared reports whether a delivered document is JSON null (or absent):
// the configuration was cleared.
func IsCleared(doc []byte) bool {
	d := bytes.TrimSpace(doc)
	return len(d) == 0 || bytes.Equal(d, []byte("null"))
}

// ConfigPath is the path of the current configuration document.
func (s *Store) ConfigPath() string { return s.Path(ConfigDir, ConfigFile) }

// ConfigStatus loads the configuration status; ok is false when the agent
// never wrote a configuration.
func (s *Store) ConfigStatus() (st ConfigStatus, ok bool, err error) {
	err = ReadJSON(s.Path(ConfigDir, configStatus), &st)
	if errors.Is(err, fs.ErrNotExist) {
		return ConfigStatus{}, false, nil
	}
	if err != nil {
		return ConfigStatus{}, false, err
	}
	return st, true, nil
}

// SetConfigStatus durably replaces the configuration status.
func (s *Store) SetConfigStatus(st ConfigStatus) error {
	if err := MkdirPrivate(s.Path(ConfigDir)); err != nil {
		return err
	}
	return WriteJSONAtomic(s.Path(ConfigDir, configStatus), st, s.durable)
}

// WriteConfig makes d the current configuration on disk: the document goes
// to current.json and {revision, hash, format} to current.meta.json, each
// replaced atomically (0600, temp file + fsync + rename + directory fsync).
// A cleared document (JSON null) removes current.json first. It answers the
// document's path, or "" when cleared.
func (s *Store) WriteConfig(d api.ConfigDelivery) (string, error) {
	dir := s.Path(ConfigDir)
	if err := MkdirPrivate(dir); err != nil {
		return "", err
	}
	path := filepath.Join(dir, ConfigFile)
	if IsCleared(d.Document) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("remove configuration: %w", err)
		}
		if s.durable {
			if err := SyncDir(dir); err != nil {
				return "", err
			}
		}
		path = ""
	} else if err := WriteFileAtomic(path, append(bytes.TrimSpace(d.Document), '\n'), 0o600, s.durable); err != nil {
		return "", fmt.Errorf("write configuration: %w", err)
	}
	meta := ConfigMeta{Revision: d.Revision, Hash: d.Hash, Format: d.Format}
	if err := WriteJSONAtomic(filepath.Join(dir, ConfigMetaFile), meta, s.durable); err != nil {
		return "", fmt.Errorf("write configuration meta: %w", err)
	}
	return path, nil
}

// ConfigMeta loads current.meta.json: the last revision whose document was
// written (an error satisfying errors.Is(err, fs.ErrNotExist) before any).
func (s *Store) ConfigMeta() (ConfigMeta, error) {
	var m ConfigMeta
	err := ReadJSON(s.Path(ConfigDir, ConfigMetaFile), &m)
	return m, err
}
