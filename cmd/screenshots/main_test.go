package main

import (
	"context"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScreenshotsSmall: the program photographs every page at both widths
// into a folder of the test's (never the tree), each a PNG as wide as
// its screen.
func TestScreenshotsSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("drives Chromium: not with -short")
	}
	if _, err := chromium(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	require.NoError(t, run(ctx, out, 1200, false))
	names := []string{"login"}
	for _, s := range shots(seeded{}) {
		names = append(names, s.name)
	}
	for _, w := range widths {
		for _, n := range names {
			f, err := os.Open(filepath.Join(out, n+"-"+w.name+".png"))
			require.NoError(t, err)
			cfg, err := png.DecodeConfig(f)
			_ = f.Close()
			require.NoError(t, err, n)
			require.EqualValues(t, w.width, cfg.Width, n)
			require.LessOrEqual(t, cfg.Height, 1200, n)
		}
	}
}
