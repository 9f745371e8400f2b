package state

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces path with data so that a reader (or a crash) sees
// either the old content or the new one, never a torn file: the bytes go to a
// temporary file in the same directory, which is fsynced, renamed over path,
// and then the directory is fsynced so the rename itself survives a power cut.
// With durable false the fsyncs are skipped (simulations that run thousands of
// agents on one disk); the rename still keeps readers from seeing torn files.
func WriteFileAtomic(path string, data []byte, perm os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if durable {
		return SyncDir(dir)
	}
	return nil
}

// WriteJSONAtomic is WriteFileAtomic of v's JSON encoding with mode 0600.
func WriteJSONAtomic(path string, v any, durable bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return WriteFileAtomic(path, append(b, '\n'), 0o600, durable)
}

// ReadJSON decodes the JSON file at path into v. A missing file is reported
// as an error satisfying errors.Is(err, fs.ErrNotExist).
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// SyncDir fsyncs a directory so that entries created, renamed or removed in it
// are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// MkdirPrivate creates dir (and parents) with mode 0700 and tightens the mode
// of dir itself if it already existed more open: the state dir holds session
// credentials and workload environments.
func MkdirPrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}
