package runtime

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/state"
)

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// normalizeDigest accepts "sha256:<hex>" or "<hex>" and returns the lowercase hex.
func normalizeDigest(d string) (string, error) {
	h := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(d), "sha256:"))
	if !hexDigest.MatchString(h) {
		return "", fmt.Errorf("sha256 %q is not 64 hex digits", d)
	}
	return h, nil
}

// artifactRecord maps an artifact id to the content it names.
type artifactRecord struct {
	ArtifactID string    `json:"artifact_id"`
	URL        string    `json:"url"`
	SHA256     string    `json:"sha256"`
	Bytes      int64     `json:"bytes"`
	PreparedAt time.Time `json:"prepared_at"`
}

// imageRecord maps an image name to the unpacked tree it names.
type imageRecord struct {
	Image      string    `json:"image"`
	ArtifactID string    `json:"artifact_id"`
	SHA256     string    `json:"sha256"`
	Dir        string    `json:"dir"`
	Files      int       `json:"files"`
	Dirs       int       `json:"dirs"`
	Symlinks   int       `json:"symlinks"`
	Bytes      int64     `json:"bytes"`
	PreparedAt time.Time `json:"prepared_at"`
}

func (p *Process) blobPath(digest string) string {
	return filepath.Join(p.dir, "artifacts", "sha256", digest)
}

func (p *Process) artifactRecordPath(id string) string {
	return filepath.Join(p.dir, "artifacts", "ids", id+".json")
}

func (p *Process) imageRecordPath(image string) string {
	sum := sha256.Sum256([]byte(image))
	return filepath.Join(p.dir, "images", "names", hex.EncodeToString(sum[:16])+".json")
}

// PrepareArtifact downloads the artifact into artifacts/sha256/<digest>,
// hashing while writing to a temporary file and renaming only a verified file
// into place, so the cache never holds bytes that do not match their name.
// A digest already cached is not downloaded again.
func (p *Process) PrepareArtifact(ctx context.Context, a api.PrepareArtifact) (string, error) {
	if err := CheckID("artifact_id", a.ArtifactID); err != nil {
		return "", err
	}
	want, err := normalizeDigest(a.SHA256)
	if err != nil {
		return "", err
	}
	blob := p.blobPath(want)
	fi, err := os.Stat(blob)
	if err == nil {
		if err := p.writeArtifactRecord(a, want, fi.Size()); err != nil {
			return "", err
		}
		return fmt.Sprintf("artifact %s already cached as sha256:%s (%d bytes)", a.ArtifactID, want, fi.Size()), nil
	}
	u, err := parseArtifactURL(a.URL)
	if err != nil {
		return "", err
	}
	for _, d := range []string{"artifacts/sha256", "artifacts/ids", "artifacts/tmp"} {
		if err := state.MkdirPrivate(filepath.Join(p.dir, d)); err != nil {
			return "", err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := p.httpClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", a.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("download %s: answered %s", a.URL, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Join(p.dir, "artifacts", "tmp"), want+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), resp.Body)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", a.URL, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if got != want {
		return "", fmt.Errorf("digest mismatch for artifact %s: expected sha256:%s, downloaded bytes (%d) hash to sha256:%s", a.ArtifactID, want, n, got)
	}
	if p.durable {
		if err := tmp.Sync(); err != nil {
			return "", err
		}
	}
	if err := tmp.Chmod(0o600); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), blob); err != nil {
		return "", err
	}
	if p.durable {
		if err := state.SyncDir(filepath.Dir(blob)); err != nil {
			return "", err
		}
	}
	if err := p.writeArtifactRecord(a, got, n); err != nil {
		return "", err
	}
	return fmt.Sprintf("artifact %s downloaded: %d bytes hashed to sha256:%s", a.ArtifactID, n, got), nil
}

func parseArtifactURL(raw string) (string, error) {
	// Plain http is acceptable for artifacts: the bytes are verified against
	// the digest the control plane sent over the authenticated channel.
	if !strings.HasPrefix(raw, "https://") && !strings.HasPrefix(raw, "http://") {
		return "", fmt.Errorf("artifact url %q: only http and https are supported", raw)
	}
	return raw, nil
}

func (p *Process) writeArtifactRecord(a api.PrepareArtifact, digest string, n int64) error {
	if err := state.MkdirPrivate(filepath.Join(p.dir, "artifacts", "ids")); err != nil {
		return err
	}
	var old artifactRecord
	if state.ReadJSON(p.artifactRecordPath(a.ArtifactID), &old) == nil && old.SHA256 == digest {
		return nil
	}
	return state.WriteJSONAtomic(p.artifactRecordPath(a.ArtifactID), artifactRecord{
		ArtifactID: a.ArtifactID, URL: a.URL, SHA256: digest, Bytes: n, PreparedAt: p.now().UTC(),
	}, p.durable)
}

// PrepareImage unpacks the (tar.gz) artifact named by artifact_id once into
// images/unpacked/<digest>/ and points the image name at it. Unpacking is
// keyed by content, so re-preparing an image with new content leaves running
// workloads on the old tree undisturbed.
func (p *Process) PrepareImage(ctx context.Context, im api.PrepareImage) (string, error) {
	if im.Image == "" || len(im.Image) > 512 {
		return "", errors.New("image name must be 1-512 characters")
	}
	if im.ArtifactID == "" {
		var rec imageRecord
		if err := state.ReadJSON(p.imageRecordPath(im.Image), &rec); err == nil {
			return fmt.Sprintf("image %s already prepared from sha256:%s", im.Image, rec.SHA256), nil
		}
		return "", fmt.Errorf("the process runtime prepares images from artifacts: image %q is not prepared and names no artifact_id", im.Image)
	}
	if err := CheckID("artifact_id", im.ArtifactID); err != nil {
		return "", err
	}
	var art artifactRecord
	if err := state.ReadJSON(p.artifactRecordPath(im.ArtifactID), &art); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("artifact %s is not prepared (prepare_artifact first)", im.ArtifactID)
		}
		return "", err
	}
	var rec imageRecord
	if err := state.ReadJSON(p.imageRecordPath(im.Image), &rec); err == nil && rec.SHA256 == art.SHA256 {
		if _, err := os.Stat(rec.Dir); err == nil {
			return fmt.Sprintf("image %s already unpacked from sha256:%s: %d files, %d dirs, %d symlinks, %d bytes", im.Image, rec.SHA256, rec.Files, rec.Dirs, rec.Symlinks, rec.Bytes), nil
		}
	}
	for _, d := range []string{"images/unpacked", "images/names"} {
		if err := state.MkdirPrivate(filepath.Join(p.dir, d)); err != nil {
			return "", err
		}
	}
	dest := filepath.Join(p.dir, "images", "unpacked", art.SHA256)
	st, err := os.Stat(dest)
	var counts unpackCounts
	if err == nil && st.IsDir() {
		// Unpacked before under another image name: the tree is complete,
		// because it only ever appears by rename.
		counts, _ = countTree(dest)
	} else {
		tmp := filepath.Join(p.dir, "images", "unpacked", ".tmp-"+art.SHA256+"-"+randSuffix())
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return "", err
		}
		counts, err = unpackTarGz(ctx, p.blobPath(art.SHA256), tmp)
		if err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("unpack artifact %s (sha256:%s): %w", im.ArtifactID, art.SHA256, err)
		}
		if err := os.Rename(tmp, dest); err != nil {
			os.RemoveAll(tmp)
			return "", err
		}
		if p.durable {
			if err := state.SyncDir(filepath.Dir(dest)); err != nil {
				return "", err
			}
		}
	}
	rec = imageRecord{
		Image: im.Image, ArtifactID: im.ArtifactID, SHA256: art.SHA256, Dir: dest,
		Files: counts.files, Dirs: counts.dirs, Symlinks: counts.symlinks, Bytes: counts.bytes,
		PreparedAt: p.now().UTC(),
	}
	if err := state.WriteJSONAtomic(p.imageRecordPath(im.Image), rec, p.durable); err != nil {
		return "", err
	}
	return fmt.Sprintf("image %s unpacked from sha256:%s: %d files, %d dirs, %d symlinks, %d bytes", im.Image, art.SHA256, counts.files, counts.dirs, counts.symlinks, counts.bytes), nil
}

// imageDir is the unpacked tree of a prepared image.
func (p *Process) imageDir(image string) (string, error) {
	var rec imageRecord
	if err := state.ReadJSON(p.imageRecordPath(image), &rec); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("image %q is not prepared (prepare_image first)", image)
		}
		return "", err
	}
	return rec.Dir, nil
}

type unpackCounts struct {
	files, dirs, symlinks int
	bytes                 int64
}

// unpackTarGz extracts src into dest through an os.Root, which refuses any
// path (including one through a symlink the archive itself planted) that would
// resolve outside dest.
func unpackTarGz(ctx context.Context, src, dest string) (unpackCounts, error) {
	var c unpackCounts
	f, err := os.Open(src)
	if err != nil {
		return c, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return c, fmt.Errorf("not a gzip stream: %w", err)
	}
	defer zr.Close()
	root, err := os.OpenRoot(dest)
	if err != nil {
		return c, err
	}
	defer root.Close()
	tr := tar.NewReader(zr)
	for {
		if err := ctx.Err(); err != nil {
			return c, err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		if err != nil {
			return c, fmt.Errorf("read tar: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." || name == "" {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return c, fmt.Errorf("entry %q escapes the image", h.Name)
		}
		if dir := path.Dir(name); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return c, fmt.Errorf("entry %q: %w", h.Name, err)
			}
		}
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return c, fmt.Errorf("entry %q: %w", h.Name, err)
			}
			if mode != 0 {
				if err := root.Chmod(name, mode|0o700); err != nil {
					return c, err
				}
			}
			c.dirs++
		case tar.TypeReg:
			out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode|0o600)
			if err != nil {
				return c, fmt.Errorf("entry %q: %w", h.Name, err)
			}
			n, err := io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return c, fmt.Errorf("entry %q: %w", h.Name, err)
			}
			c.files++
			c.bytes += n
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return c, fmt.Errorf("entry %q: %w", h.Name, err)
			}
			c.symlinks++
		default:
			// Devices, fifos and hard links have no place in a process image.
			return c, fmt.Errorf("entry %q: unsupported tar entry type %q", h.Name, h.Typeflag)
		}
	}
}

func countTree(dir string) (unpackCounts, error) {
	var c unpackCounts
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			c.symlinks++
		case d.IsDir():
			c.dirs++
		default:
			c.files++
			if fi, err := d.Info(); err == nil {
				c.bytes += fi.Size()
			}
		}
		return nil
	})
	return c, err
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
