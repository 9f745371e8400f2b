package controlplane_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/server/controlplane"
)

// selfSigned writes a CA-signed localhost certificate and answers the
// paths of the certificate, its key and the CA.
func selfSigned(t *testing.T) (certFile, keyFile, caFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nodeward test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600))
		return p
	}
	return write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER), write("ca.pem", "CERTIFICATE", caDER)
}

func serve(t *testing.T, cfg controlplane.Config) (*controlplane.App, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Listen = ln.Addr().String()
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 5 * time.Second
	}
	cfg.LogLevel, cfg.LogFormat = "info", "json"
	ctx, cancel := context.WithCancel(context.Background())
	app, err := controlplane.Open(ctx, cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, app.Close())
	})
	return app, ln.Addr().String()
}

// TestServesTLS: with a certificate the control plane speaks HTTPS only,
// marks it with HSTS, and hands agents its private CA in bootstraps.
func TestServesTLS(t *testing.T) {
	cleanEnv(t)
	cert, key, caFile := selfSigned(t)
	app, addr := serve(t, controlplane.Config{DataDir: t.TempDir(), TLSCertFile: cert, TLSKeyFile: key, TLSCAFile: caFile})
	require.Equal(t, "https://"+addr, app.Config.PublicURL)

	caPEM, err := os.ReadFile(caFile)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Strict-Transport-Security"), "max-age=")
	// The long-poll, served past the router, marks its answers the same.
	resp, err = hc.Get("https://" + addr + "/agent/v1/commands")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Strict-Transport-Security"), "max-age=")

	plain, err := http.Get("http://" + addr + "/healthz")
	if err == nil {
		plain.Body.Close()
		require.NotEqual(t, http.StatusOK, plain.StatusCode, "no plain HTTP on a TLS listener")
	}

	_, err = app.Auth.CreateAdmin(context.Background(), "tls-admin", "a-long-enough-password")
	require.NoError(t, err)
	tok, _, err := app.Auth.CreateTokenFor(context.Background(), "tls-admin", "t")
	require.NoError(t, err)
	req, _ := http.NewRequest("POST", "https://"+addr+"/api/v1/nodes/invitations", strings.NewReader(`{"rental_id":"tls","generation":1}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err = hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(raw))
	var boot api.Bootstrap
	require.NoError(t, json.Unmarshal(raw, &boot))
	require.Equal(t, string(caPEM), boot.CACertificatePEM)
	require.Equal(t, "https://"+addr, boot.ControlPlaneURL)
}

// TestBehindATLSProxy: a server whose public URL is https serves plain
// HTTP to a proxy that terminates TLS; browsers still reach it over https,
// so its session cookie is Secure and its answers carry HSTS.
func TestBehindATLSProxy(t *testing.T) {
	cleanEnv(t)
	app, addr := serve(t, controlplane.Config{DataDir: t.TempDir(), PublicURL: "https://nodeward.example.com"})
	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, resp.Header.Get("Strict-Transport-Security"), "max-age=")

	_, err = app.Auth.CreateAdmin(context.Background(), "proxied", "a-long-enough-password")
	require.NoError(t, err)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.PostForm("http://"+addr+"/console/login", url.Values{"username": {"proxied"}, "password": {"a-long-enough-password"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "nodeward_session" {
			session = c
		}
	}
	require.NotNil(t, session)
	require.True(t, session.Secure, "the session cookie is Secure behind an https public URL")
	require.True(t, session.HttpOnly)
}

// TestGeneratedMasterKey: the embedded default makes its own key, private to
// the user, and keeps it across restarts (credentials survive a restart).
func TestGeneratedMasterKey(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	app, _ := serve(t, controlplane.Config{DataDir: dir})
	keyPath := filepath.Join(dir, "master.key")
	st, err := os.Stat(keyPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	first, err := os.ReadFile(keyPath)
	require.NoError(t, err)
	require.Len(t, strings.TrimSpace(string(first)), 64)
	_ = app

	other := t.TempDir()
	r := mainRun(t, "", "migrate", "--data-dir", other)
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "generated a new master key", "the operator is told")
	generated, err := os.ReadFile(filepath.Join(other, "master.key"))
	require.NoError(t, err)
	r = mainRun(t, "", "migrate", "--data-dir", other)
	require.Equal(t, 0, r.code)
	require.NotContains(t, r.stderr, "generated a new master key")
	again, err := os.ReadFile(filepath.Join(other, "master.key"))
	require.NoError(t, err)
	require.Equal(t, generated, again, "a restart keeps the key")
}
