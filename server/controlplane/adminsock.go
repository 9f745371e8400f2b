package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/models"
)

// The administrative socket lets `admin …` and `token create` reach a
// running server whose SQLite data folder is locked. It is a unix socket in
// the data folder, owner-only: whoever may open the data folder may
// administer the server, and nobody else. It speaks a tiny internal JSON API
// over HTTP that is never served on TCP and is not part of openapi.yaml.

// SocketName is the administrative socket's file name in the data folder.
const SocketName = "nodeward.sock"

// SocketPath is where a server using dataDir listens for administrative
// commands.
func SocketPath(dataDir string) string { return filepath.Join(dataDir, SocketName) }

// Requests and answers of the internal API.
type (
	adminCreateRequest struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	adminCreateResponse struct {
		Username string `json:"username"`
	}
	// adminRequest names an administrator, with a password for a reset.
	adminRequest struct {
		Username string `json:"username"`
		Password string `json:"password,omitempty"`
	}
	adminChangeResponse struct {
		SessionsEnded int64 `json:"sessions_ended"`
		// Disabled: the administrator is disabled (after a password reset,
		// so the command can say they still cannot sign in).
		Disabled bool `json:"disabled,omitempty"`
	}
	adminListResponse struct {
		Admins []adminRow `json:"admins"`
	}
	tokenCreateRequest struct {
		Name     string `json:"name"`
		Username string `json:"username,omitempty"`
	}
	tokenCreateResponse struct {
		Token    string `json:"token"`
		Username string `json:"username"`
	}
	socketError struct {
		Code   errcode.Code         `json:"code"`
		Detail string               `json:"detail"`
		Fields []errcode.FieldError `json:"fields,omitempty"`
	}
)

// adminRow is one administrator as `admin list` prints it.
type adminRow struct {
	Username     string     `json:"username"`
	CreatedAt    time.Time  `json:"created_at"`
	DisabledAt   *time.Time `json:"disabled_at"`
	LiveSessions int64      `json:"live_sessions"`
}

// adminOps is what the administrative subcommands do, either in this process
// on an open database or through a running server's socket.
type adminOps interface {
	createAdmin(ctx context.Context, username, password string) (string, error)
	// resetPassword sets the password and answers how many console
	// sessions it ended, and whether the administrator is disabled.
	resetPassword(ctx context.Context, username, password string) (ended int64, disabled bool, err error)
	// setDisabled disables (or enables) the administrator and answers how
	// many console sessions it ended.
	setDisabled(ctx context.Context, username string, disabled bool) (int64, error)
	listAdmins(ctx context.Context) ([]adminRow, error)
	// createToken answers the token and its owner's username; an empty
	// username means the first administrator.
	createToken(ctx context.Context, username, name string) (token, owner string, err error)
}

// direct runs the administrative operations on an auth service.
type direct struct{ auth *auth.Service }

func (d direct) createAdmin(ctx context.Context, username, password string) (string, error) {
	u, err := d.auth.CreateAdmin(ctx, username, password)
	return u.Username, err
}

func (d direct) resetPassword(ctx context.Context, username, password string) (int64, bool, error) {
	u, ended, err := d.auth.ResetPassword(ctx, auth.SystemActor, username, password, "cli")
	return ended, u.DisabledAt != nil, err
}

func (d direct) setDisabled(ctx context.Context, username string, disabled bool) (int64, error) {
	if !disabled {
		_, err := d.auth.EnableAdmin(ctx, auth.SystemActor, username, "cli")
		return 0, err
	}
	_, ended, err := d.auth.DisableAdmin(ctx, auth.SystemActor, username, "cli")
	return ended, err
}

func (d direct) listAdmins(ctx context.Context) ([]adminRow, error) {
	users, err := d.auth.ListAdmins(ctx, nil, 0) // every one: a handful
	if err != nil {
		return nil, err
	}
	out := make([]adminRow, 0, len(users))
	for _, u := range users {
		out = append(out, adminRow{Username: u.Username, CreatedAt: u.CreatedAt, DisabledAt: u.DisabledAt, LiveSessions: u.LiveSessions})
	}
	return out, nil
}

func (d direct) createToken(ctx context.Context, username, name string) (string, string, error) {
	if username == "" {
		u, err := d.auth.FirstAdmin(ctx)
		if err != nil {
			return "", "", err
		}
		username = u.Username
	}
	tok, _, err := d.auth.CreateTokenFor(ctx, username, name)
	return tok, username, err
}

// listenSocket binds the administrative socket of dataDir, readable and
// writable by this user only. It binds in a fresh private folder and renames
// the socket into place, so it is never reachable with wider permissions;
// the rename replaces a socket left by a killed server (the data folder lock
// this process holds means no live server owns it).
func listenSocket(dataDir string) (*net.UnixListener, error) {
	tmp, err := os.MkdirTemp(dataDir, ".s")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bound := filepath.Join(tmp, "s")
	name, release, err := unixName(bound)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	release()
	if err != nil {
		return nil, err
	}
	// The socket moves; Close must not unlink by its old name.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(bound, 0o600); err != nil {
		_ = ln.Close()
		return nil, err
	}
	if err := os.Rename(bound, SocketPath(dataDir)); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// maxUnixName is the longest socket path the kernel takes (sockaddr_un's
// 108 bytes, less its terminating NUL).
const maxUnixName = 107

// unixName answers a name for the socket at path that fits a socket
// address: path itself, or on Linux, when a deep data folder makes it too
// long, the same file reached through a descriptor of its folder
// (/proc/self/fd/N/name). release closes that descriptor once the socket
// is bound or dialled.
func unixName(path string) (name string, release func(), err error) {
	if len(path) <= maxUnixName || runtime.GOOS != "linux" {
		return path, func() {}, nil
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)), func() { _ = dir.Close() }, nil
}

// serveSocket serves the administrative socket on SQLite (on PostgreSQL the
// subcommands open the database themselves) and returns what stops it.
func (a *App) serveSocket() (stop func()) {
	if a.DB.Dialect != models.SQLite {
		return func() {}
	}
	ln, err := listenSocket(a.Config.DataDir)
	if err != nil {
		a.Log.Warn("no administrative socket: `admin create` and `token create` need this server stopped", "err", err)
		return func() {}
	}
	srv := &http.Server{Handler: socketHandler(direct{a.Auth}, a.Log), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return func() {
		_ = srv.Close()
		<-done
		_ = os.Remove(SocketPath(a.Config.DataDir))
	}
}

// socketHandler is the internal API: POST /v1/admins (create),
// /v1/admins/password, /v1/admins/disable, /v1/admins/enable,
// /v1/admins/list and /v1/tokens.
func socketHandler(ops adminOps, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/admins/password", func(w http.ResponseWriter, r *http.Request) {
		var req adminRequest
		if !decodeSocket(w, r, &req) {
			return
		}
		n, disabled, err := ops.resetPassword(r.Context(), req.Username, req.Password)
		answerSocket(w, log, adminChangeResponse{SessionsEnded: n, Disabled: disabled}, err)
	})
	for path, disabled := range map[string]bool{"/v1/admins/disable": true, "/v1/admins/enable": false} {
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
			var req adminRequest
			if !decodeSocket(w, r, &req) {
				return
			}
			n, err := ops.setDisabled(r.Context(), req.Username, disabled)
			answerSocket(w, log, adminChangeResponse{SessionsEnded: n}, err)
		})
	}
	mux.HandleFunc("POST /v1/admins/list", func(w http.ResponseWriter, r *http.Request) {
		if !decodeSocket(w, r, &struct{}{}) {
			return
		}
		rows, err := ops.listAdmins(r.Context())
		answerSocket(w, log, adminListResponse{Admins: rows}, err)
	})
	mux.HandleFunc("POST /v1/admins", func(w http.ResponseWriter, r *http.Request) {
		var req adminCreateRequest
		if !decodeSocket(w, r, &req) {
			return
		}
		name, err := ops.createAdmin(r.Context(), req.Username, req.Password)
		answerSocket(w, log, adminCreateResponse{Username: name}, err)
	})
	mux.HandleFunc("POST /v1/tokens", func(w http.ResponseWriter, r *http.Request) {
		var req tokenCreateRequest
		if !decodeSocket(w, r, &req) {
			return
		}
		tok, owner, err := ops.createToken(r.Context(), req.Username, req.Name)
		answerSocket(w, log, tokenCreateResponse{Token: tok, Username: owner}, err)
	})
	return mux
}

func decodeSocket(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeSocket(w, http.StatusBadRequest, socketError{Code: errcode.InvalidJSON, Detail: "the request is not the expected JSON"})
		return false
	}
	return true
}

func answerSocket(w http.ResponseWriter, log *slog.Logger, v any, err error) {
	if err == nil {
		writeSocket(w, http.StatusOK, v)
		return
	}
	var e *errcode.Error
	if !errors.As(err, &e) {
		log.Error("administrative socket", "err", err)
		writeSocket(w, http.StatusInternalServerError, socketError{Code: errcode.Internal, Detail: "internal error (see the server's log)"})
		return
	}
	writeSocket(w, http.StatusUnprocessableEntity, socketError{Code: e.Code, Detail: e.Error(), Fields: e.Fields})
}

func writeSocket(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// socketClient runs the administrative operations through a running
// server's socket.
type socketClient struct{ http *http.Client }

// dialSocket connects to the server holding dataDir, or answers false when
// none answers there (no socket file, or one a killed server left).
func dialSocket(dataDir string) (socketClient, bool) {
	path := SocketPath(dataDir)
	var d net.Dialer
	dial := func(ctx context.Context) (net.Conn, error) {
		name, release, err := unixName(path)
		if err != nil {
			return nil, err
		}
		defer release()
		return d.DialContext(ctx, "unix", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := dial(ctx)
	cancel()
	if err != nil {
		return socketClient{}, false
	}
	_ = c.Close()
	return socketClient{http: &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		}},
	}}, true
}

func (s socketClient) createAdmin(ctx context.Context, username, password string) (string, error) {
	var out adminCreateResponse
	err := s.call(ctx, "/v1/admins", adminCreateRequest{Username: username, Password: password}, &out)
	return out.Username, err
}

func (s socketClient) resetPassword(ctx context.Context, username, password string) (int64, bool, error) {
	var out adminChangeResponse
	err := s.call(ctx, "/v1/admins/password", adminRequest{Username: username, Password: password}, &out)
	return out.SessionsEnded, out.Disabled, err
}

func (s socketClient) setDisabled(ctx context.Context, username string, disabled bool) (int64, error) {
	path := "/v1/admins/enable"
	if disabled {
		path = "/v1/admins/disable"
	}
	var out adminChangeResponse
	err := s.call(ctx, path, adminRequest{Username: username}, &out)
	return out.SessionsEnded, err
}

func (s socketClient) listAdmins(ctx context.Context) ([]adminRow, error) {
	var out adminListResponse
	err := s.call(ctx, "/v1/admins/list", struct{}{}, &out)
	return out.Admins, err
}

func (s socketClient) createToken(ctx context.Context, username, name string) (string, string, error) {
	var out tokenCreateResponse
	err := s.call(ctx, "/v1/tokens", tokenCreateRequest{Name: name, Username: username}, &out)
	return out.Token, out.Username, err
}

func (s socketClient) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://nodeward"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("the running server's administrative socket: %w", err)
	}
	defer resp.Body.Close()
	// Answers are small, but a listing of many administrators is not tiny.
	dec := json.NewDecoder(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode != http.StatusOK {
		var e socketError
		if err := dec.Decode(&e); err != nil || e.Code == "" {
			return fmt.Errorf("the running server's administrative socket answered %s", resp.Status)
		}
		return &errcode.Error{Code: e.Code, Message: e.Detail, Fields: e.Fields}
	}
	return dec.Decode(out)
}
