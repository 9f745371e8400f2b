package controlplane

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// The first-run line tells both binary and `go run` users how to create the
// administrator from the command line, and nobody to stop the server.
func TestAnnounceSetupLine(t *testing.T) {
	for _, d := range dbtest.Dialects(t) {
		t.Run(d, func(t *testing.T) {
			cfg := Config{Listen: "127.0.0.1:8080", ShutdownGrace: time.Second, LogLevel: "info", LogFormat: "json"}
			if d == models.SQLite {
				cfg.DataDir = t.TempDir()
			} else {
				cfg.DatabaseURL = dbtest.NewSchema(t)
				cfg.MasterKey = "6e6f64657761726420746573742d6f6e6c79206d6173746572206b657920303031"
			}
			var buf bytes.Buffer
			app, err := Open(context.Background(), cfg, slog.New(slog.NewJSONHandler(&buf, nil)))
			require.NoError(t, err)
			defer app.Close()
			app.announce(context.Background(), cfg.Listen)
			require.Contains(t, buf.String(), "/console/setup#nws_")
			require.Contains(t, buf.String(), "`go run ./server admin create ...`")
			require.Contains(t, buf.String(), "`admin create --username NAME --password-stdin`")
			require.NotContains(t, buf.String(), "stop the server")
		})
	}
}
