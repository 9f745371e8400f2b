package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
)

// declaredCodes reads every errcode.Code constant from the errcode
// package's source, so a code added there without a status fails here.
func declaredCodes(t *testing.T) []errcode.Code {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../errcode/errcode.go", nil, 0)
	require.NoError(t, err)
	var codes []errcode.Code
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				s, err := strconv.Unquote(v.(*ast.BasicLit).Value)
				require.NoError(t, err)
				codes = append(codes, errcode.Code(s))
			}
		}
	}
	require.NotEmpty(t, codes)
	return codes
}

func TestEveryCodeHasAStatus(t *testing.T) {
	for _, c := range declaredCodes(t) {
		status, ok := statusOf[c]
		require.True(t, ok, "errcode %q has no HTTP status in statusOf", c)
		require.GreaterOrEqual(t, status, 400, "errcode %q", c)
	}
	require.Equal(t, http.StatusServiceUnavailable, statusOf[errcode.Overloaded], "DECISIONS.md §44")
}

// requestWithLog answers a request whose logger writes to buf.
func requestWithLog(buf *bytes.Buffer) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/api/v1/whoami", nil)
	l := slog.New(slog.NewTextHandler(buf, nil))
	return r.WithContext(context.WithValue(r.Context(), requestIDKey, &requestInfo{id: "test", log: l}))
}

func TestUnmappedCodeIs500AndLogged(t *testing.T) {
	var log bytes.Buffer
	w := httptest.NewRecorder()
	writeError(w, requestWithLog(&log), errcode.New("not_in_the_table", "secretless message"))
	require.Equal(t, http.StatusInternalServerError, w.Code)
	var p problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	require.Equal(t, errcode.Internal, p.Code)
	require.Equal(t, "internal error", p.Detail, "the unmapped error's text is not shown")
	require.Contains(t, log.String(), "not_in_the_table")
}

// TestConsoleAndAPIShareTheMapping: one error answers the same status, a
// 503 the same Retry-After and a 408 the same Connection: close, on an API
// path and on a console page.
func TestConsoleAndAPIShareTheMapping(t *testing.T) {
	h := &handler{}
	for _, tc := range []struct {
		err    error
		status int
	}{
		{auth.ErrOverloaded, http.StatusServiceUnavailable},
		{auth.ErrTokenNotFound, http.StatusNotFound},
		{errcode.New(errcode.RequestTimeout, "request body not received within the server's read timeout (10 s)"), http.StatusRequestTimeout},
		{errcode.New("not_in_the_table", "x"), http.StatusInternalServerError},
		{errors.New("database exploded"), http.StatusInternalServerError},
	} {
		var log bytes.Buffer
		api := httptest.NewRecorder()
		writeError(api, requestWithLog(&log), tc.err)
		page := httptest.NewRecorder()
		h.consoleInternal(page, requestWithLog(&log), tc.err)

		require.Equal(t, tc.status, api.Code, "%v", tc.err)
		require.Equal(t, tc.status, page.Code, "%v", tc.err)
		require.Equal(t, api.Header().Get("Retry-After"), page.Header().Get("Retry-After"))
		require.Equal(t, api.Header().Get("Connection"), page.Header().Get("Connection"))
		require.Equal(t, "text/html; charset=utf-8", page.Header().Get("Content-Type"))
		if tc.status == http.StatusServiceUnavailable {
			require.NotEmpty(t, page.Header().Get("Retry-After"))
			var p problem
			require.NoError(t, json.Unmarshal(api.Body.Bytes(), &p))
			require.Equal(t, errcode.Overloaded, p.Code)
		}
		if tc.status == http.StatusRequestTimeout {
			require.Equal(t, "close", page.Header().Get("Connection"), "the rest of the body is unread")
		}
	}
}

// A JSON answer goes out with its length, not chunked: a flushed answer
// of unknown length is chunked, and its closing chunk costs the connection
// a second write after the handler returns (three answers per command).
// The body is what json.Encoder wrote before: the value and a newline.
func TestJSONAnswerCarriesItsLength(t *testing.T) {
	v := map[string]any{"commands": []string{"a<b"}, "n": 1}
	flushed := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		flushed <- writeJSONChecked(w, http.StatusCreated, v)
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body bytes.Buffer
	_, err = body.ReadFrom(resp.Body)
	require.NoError(t, err)
	require.NoError(t, <-flushed)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Empty(t, resp.TransferEncoding, "not chunked")
	require.Equal(t, int64(body.Len()), resp.ContentLength)
	var want bytes.Buffer
	require.NoError(t, json.NewEncoder(&want).Encode(v))
	require.Equal(t, want.String(), body.String())
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
}
