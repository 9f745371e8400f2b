package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/offstack"
)

type ctxKey int

const (
	requestIDKey ctxKey = iota
	principalKey
	bodyStateKey
)

// requestInfo is what the request's context carries for logging: its id
// and the server's logger. The logger with the id attached is made only
// when a line is logged (most requests log one access line, and a held
// poll none until it is answered; slog's With copies the handler). On the
// agent doors it also carries the session authAgent verified: one context
// layer and one copy of the request fewer, which a held poll would keep for
// its whole wait.
type requestInfo struct {
	id  string
	log *slog.Logger
	// proxy is the TCP peer when the client was read from X-Forwarded-For
	// (fromProxy), for the access log; nil otherwise. A pointer rather than
	// a string keeps requestInfo in its 64-byte size class: a request that
	// came through no trusted proxy costs nothing more.
	proxy *string

	agent   fleet.Session
	agentOK bool
}

func requestIDFrom(ctx context.Context) string {
	ri, _ := ctx.Value(requestIDKey).(*requestInfo)
	if ri == nil {
		return ""
	}
	return ri.id
}

// logger returns the request's logger (carrying its request id).
func logger(r *http.Request) *slog.Logger {
	if ri, ok := r.Context().Value(requestIDKey).(*requestInfo); ok {
		return ri.log.With("request_id", ri.id)
	}
	return slog.Default()
}

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// requestID takes the caller's X-Request-Id when it is well formed, else
// mints one, and puts it on the response, the context and the logger,
// with the proxy the request came through (fromProxy's answer, "" for
// none).
func (h *handler) requestID(w http.ResponseWriter, r *http.Request, proxy string) *http.Request {
	r, id := h.withRequestID(r, proxy)
	w.Header().Set("X-Request-Id", id)
	return r
}

// withRequestID is requestID without the response: it answers the id for
// the caller to put there.
func (h *handler) withRequestID(r *http.Request, proxy string) (*http.Request, string) {
	id := r.Header.Get("X-Request-Id")
	if !requestIDPattern.MatchString(id) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
	}
	ri := &requestInfo{id: id, log: h.log}
	if proxy != "" {
		p := proxy // allocated here only, not for every request
		ri.proxy = &p
	}
	return r.WithContext(context.WithValue(r.Context(), requestIDKey, ri)), id
}

// recovered turns a panic into a logged 500 problem.
func recovered(w http.ResponseWriter, r *http.Request, v any) {
	if v == http.ErrAbortHandler {
		panic(v)
	}
	logger(r).Error("panic", "panic", v, "stack", string(debug.Stack()))
	writeError(w, r, errcode.New(errcode.Internal, "internal error"))
}

// edge is what every request passes before routing, outermost first: the
// body's read deadline (bodyReadTimeout), the request id, panic recovery,
// the access log and metrics, the security headers, the body limit, the
// cross-origin check and the plain-path check (plainPath, /api and /agent
// paths left to their own, after authentication).
//
// They are one layer rather than a chain of eight: a held long-poll parks
// under every frame of the chain, and its goroutine's stack stays as large
// as a power of two above four times their depth (the collector halves a
// parked stack only while less than a quarter is in use). One frame here,
// with the work in calls that have returned before the handler runs,
// keeps a held poll's stack at half the size (BENCHMARKS.md, memory per
// held poll).
func (h *handler) edge(bodyTimeout time.Duration, limit int64, cop *http.CrossOriginProtection) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return &edgeHandler{h: h, next: next, bodyTimeout: bodyTimeout, limit: limit, cop: cop}
	}
}

// edgeHandler is edge's layer: a type of its own rather than a
// http.HandlerFunc, which would add a frame under every held poll.
type edgeHandler struct {
	h           *handler
	next        http.Handler
	bodyTimeout time.Duration
	limit       int64
	cop         *http.CrossOriginProtection
	// route, when set, is the one route next serves (the access log's and
	// the metrics' label); otherwise chi's route context names it.
	route string
}

func (e *edgeHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.route != "" {
		// The long-poll's edge (pollRoute): its own work runs off the stack
		// the poll parks on (offstack), as the poll's does.
		e.serveOffStack(w, r)
		return
	}
	proxy := e.h.fromProxy(r)
	r = e.h.requestID(w, limitBodyTime(w, r, e.bodyTimeout), proxy)
	defer func() {
		if v := recover(); v != nil {
			recovered(w, r, v)
		}
	}()
	start := time.Now()
	ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
	if e.h.admit(ww, r, e.limit, e.cop) {
		e.next.ServeHTTP(ww, r)
	}
	e.h.logRequest(r, ww, start, e.route)
}

// serveOffStack is ServeHTTP with the request id, the admission checks
// and the access log run through offstack, and the headers every answer
// carries set as the answer is written (lateHeaders).
func (e *edgeHandler) serveOffStack(w http.ResponseWriter, r *http.Request) {
	var (
		ww    middleware.WrapResponseWriter
		start time.Time
		ok    bool
	)
	offstack.Run(func() {
		var id string
		proxy := e.h.fromProxy(r)
		r, id = e.h.withRequestID(limitBodyTime(w, r, e.bodyTimeout), proxy)
		start = time.Now()
		ww = middleware.NewWrapResponseWriter(&lateHeaders{ResponseWriter: w, id: id, tls: r.TLS != nil || e.h.SecureCookies}, r.ProtoMajor)
		ok = e.h.admitted(ww, r, e.limit, e.cop)
	})
	defer func() {
		if v := recover(); v != nil {
			// Through ww, whose lateHeaders gives the 500 the headers too.
			offstack.Run(func() { recovered(ww, r, v) })
		}
	}()
	if ok {
		e.next.ServeHTTP(ww, r)
	}
	offstack.Run(func() { e.h.logRequest(r, ww, start, e.route) })
}

// admit sets the headers every answer carries and answers the request's
// refusal itself when its body is too large (413), it comes cross-site
// (403) or its path is not plain text (404); it reports whether the
// request goes on. The body is capped at limit from here.
func (h *handler) admit(w http.ResponseWriter, r *http.Request, limit int64, cop *http.CrossOriginProtection) bool {
	setSecurityHeaders(w, r.TLS != nil || h.SecureCookies)
	return h.admitted(w, r, limit, cop)
}

// admitted is admit without the headers.
func (h *handler) admitted(w http.ResponseWriter, r *http.Request, limit int64, cop *http.CrossOriginProtection) bool {
	if r.ContentLength > limit {
		h.refuseAtTheEdge(w, r, errcode.Errorf(errcode.PayloadTooLarge, "request body exceeds %d bytes", limit))
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	// Browsers say where a request comes from; a cross-site state change is
	// refused for the console and for cookie-authenticated API calls alike.
	// Scripts and agents send no such headers and are unaffected.
	if err := cop.Check(r); err != nil {
		h.refuseAtTheEdge(w, r, errcode.New(errcode.PermissionDenied, "cross-origin request refused"))
		return false
	}
	if !plainText(r.URL.Path) && !isAPIPath(r.URL.Path) {
		h.notFound(w, r)
		return false
	}
	return true
}

// refuseAtTheEdge answers a refusal made before routing: a console
// address as a page, since a browser shows it to a person, anything else
// as the problem scripts read.
func (h *handler) refuseAtTheEdge(w http.ResponseWriter, r *http.Request, err *errcode.Error) {
	if isConsolePath(r.URL.Path) {
		h.consoleResolved(w, r, h.cookieConsoleCtx(r), err)
		return
	}
	writeError(w, r, err)
}

// statusClientClosed labels, in metrics and the access log, a request whose
// client hung up before it was answered (nginx's 499). It is no server
// fault: 5xx counts stay for real ones.
const statusClientClosed = 499

// maxLoggedText bounds each piece of client-controlled text in a log line
// (the path, the user agent), so a client cannot make the log grow by more
// than a few hundred bytes per request.
const maxLoggedText = 256

// clip shortens client-controlled text for logging: at most max bytes,
// cut on a rune boundary, with how much was left out.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(+" + strconv.Itoa(len(s)-cut) + " bytes)"
}

// clientGone reports that the client hung up: the request's context is
// cancelled while the server was still at it. A body that did not arrive in
// time also cancels the context (the connection is broken), but that
// client gets its answer and is not counted as gone.
func clientGone(r *http.Request) bool {
	if !errors.Is(r.Context().Err(), context.Canceled) {
		return false
	}
	st, _ := r.Context().Value(bodyStateKey).(*bodyState)
	return st == nil || !st.timedOut.Load()
}

// methodLabel names a request's method for metrics: a client may send any
// token as a method, and each new label value would be a new series kept
// in memory for good.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

// logRequest logs one structured line per answered request and counts it.
// It logs the route pattern, never the query string (which could carry a
// secret), and client-controlled text clipped.
func (h *handler) logRequest(r *http.Request, ww middleware.WrapResponseWriter, start time.Time, route string) {
	{
		if route == "" {
			route = chi.RouteContext(r.Context()).RoutePattern()
		}
		if route == "" {
			route = "unmatched"
		}
		status := ww.Status()
		// A request given up by its client is counted apart unless it was
		// already answered with a verdict of its own (2xx-4xx).
		if clientGone(r) && (status == 0 || status >= 500) {
			status = statusClientClosed
		}
		if status == 0 {
			status = http.StatusOK
		}
		elapsed := time.Since(start)
		h.metrics.HTTPRequests.WithLabelValues(route, methodLabel(r.Method), strconv.Itoa(status)).Inc()
		h.metrics.HTTPDuration.WithLabelValues(route).Observe(elapsed.Seconds())
		level := slog.LevelInfo
		switch {
		case status == statusClientClosed:
			level = slog.LevelDebug
		// 503 is the server saying "not now" (draining); it is no fault.
		case status >= 500 && status != http.StatusServiceUnavailable:
			level = slog.LevelError
		}
		if !h.log.Enabled(r.Context(), level) {
			return
		}
		ri, _ := r.Context().Value(requestIDKey).(*requestInfo)
		var id string
		if ri != nil {
			id = ri.id
		}
		// The request id first, as logger(r)'s lines carry it, without
		// copying the handler for this one line.
		// Typed attributes: the same line, without boxing each value.
		attrs := [...]slog.Attr{slog.String("request_id", id),
			slog.String("method", clip(r.Method, 16)), slog.String("path", clip(loggedPath(r.URL.Path), maxLoggedText)),
			slog.String("route", route), slog.Int("status", status),
			slog.Int("bytes", ww.BytesWritten()), slog.Int64("duration_ms", elapsed.Milliseconds()), slog.String("remote", r.RemoteAddr),
			slog.String("user_agent", clip(r.UserAgent(), maxLoggedText)), {}}
		n := len(attrs) - 1
		if ri != nil && ri.proxy != nil {
			// remote is the client a trusted proxy forwarded for; this is
			// the proxy (the balancer it came through).
			attrs[n] = slog.String("proxy", *ri.proxy)
			n++
		}
		h.log.LogAttrs(r.Context(), level, "http", attrs[:n]...)
	}
}

// Header values set on every answer, shared by all of them: Header.Set
// would allocate a one-element slice for each, per request. Nothing writes
// into a header's value slice in place (Set replaces it, Add appends to a
// full slice, which copies), so sharing them is safe.
var (
	hdrNosniff    = []string{"nosniff"}
	hdrDeny       = []string{"DENY"}
	hdrNoReferrer = []string{"no-referrer"}
	hdrCSP        = []string{"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"}
	hdrSameOrigin = []string{"same-origin"}
	hdrHSTS       = []string{"max-age=31536000"}
	hdrJSON       = []string{"application/json"}
	hdrNoStore    = []string{"no-store"}
)

// securityHeaders are the headers every answer carries, by canonical key
// (as Header.Set would write it); Strict-Transport-Security is added over
// TLS.
var securityHeaders = [...]struct {
	key   string
	value []string
}{
	{"X-Content-Type-Options", hdrNosniff},
	{"X-Frame-Options", hdrDeny},
	{"Referrer-Policy", hdrNoReferrer},
	{"Content-Security-Policy", hdrCSP},
	{"Cross-Origin-Opener-Policy", hdrSameOrigin},
}

// setSecurityHeaders sets the headers every answer carries, leaving any
// the handler has set itself as it set them.
func setSecurityHeaders(w http.ResponseWriter, tls bool) {
	hd := w.Header()
	for _, sh := range securityHeaders {
		setIfAbsent(hd, sh.key, sh.value)
	}
	if tls {
		setIfAbsent(hd, "Strict-Transport-Security", hdrHSTS)
	}
}

func setIfAbsent(hd http.Header, key string, value []string) {
	if _, ok := hd[key]; !ok {
		hd[key] = value
	}
}

// lateHeaders is the long-poll's response writer (under the access log's):
// it sets the headers every answer carries — the security headers and the
// request id — when the answer's header is written rather than when the
// request arrives, so a held poll keeps no header map while it waits
// (~0.4 KB a held poll; BENCHMARKS.md, memory per held poll). A header the
// handler set itself is left as it set it.
type lateHeaders struct {
	http.ResponseWriter
	id      string
	tls     bool
	applied bool
}

func (l *lateHeaders) apply() {
	if l.applied {
		return
	}
	l.applied = true
	setSecurityHeaders(l.ResponseWriter, l.tls)
	setIfAbsent(l.ResponseWriter.Header(), "X-Request-Id", []string{l.id})
}

func (l *lateHeaders) WriteHeader(code int) {
	l.apply()
	l.ResponseWriter.WriteHeader(code)
}

func (l *lateHeaders) Write(p []byte) (int, error) {
	l.apply()
	return l.ResponseWriter.Write(p)
}

// FlushError lets http.ResponseController flush through it (the poll's
// answer is flushed to learn whether it reached the connection).
func (l *lateHeaders) FlushError() error {
	l.apply()
	return http.NewResponseController(l.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the connection's writer.
func (l *lateHeaders) Unwrap() http.ResponseWriter { return l.ResponseWriter }

// bodyReadTimeout bounds the time to receive a request's body: a client
// that declares a body and then trickles or withholds it is cut off after
// timeout instead of holding the connection. A request without a body is
// never bounded, and the bound ends with the body (net/http lifts the
// connection's read deadline once the body has been read to its end, to
// watch for a hang-up), so a handler that then waits (a long-poll, a
// waiting submit, a watch) is not cut short by it. The headers are bounded
// by the server's ReadHeaderTimeout.
func bodyReadTimeout(timeout time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, limitBodyTime(w, r, timeout))
		})
	}
}

// limitBodyTime is bodyReadTimeout's work: it answers the request to go on
// with.
func limitBodyTime(w http.ResponseWriter, r *http.Request, timeout time.Duration) *http.Request {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		// A writer without deadlines (a test recorder): nothing to bound.
		return r
	}
	st := &bodyState{limit: timeout}
	r = r.WithContext(context.WithValue(r.Context(), bodyStateKey, st))
	r.Body = &deadlineBody{ReadCloser: r.Body, state: st}
	return r
}

// bodyState is what the request's context knows of its body's deadline.
type bodyState struct {
	timedOut atomic.Bool
	limit    time.Duration // for the refusal's detail
}

// bodyTimeout is the refusal of a body its read deadline cut off, or nil
// when err is another failure. The deadline fails the read with
// os.ErrDeadlineExceeded: inside a *net.OpError on HTTP/1, wrapped as the
// stream's error on HTTP/2.
func bodyTimeout(r *http.Request, err error) *errcode.Error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	st, _ := r.Context().Value(bodyStateKey).(*bodyState)
	if st == nil {
		return errcode.New(errcode.RequestTimeout, "request body not received within the server's read timeout")
	}
	return errcode.Errorf(errcode.RequestTimeout, "request body not received within the server's read timeout (%s s)",
		strconv.FormatFloat(st.limit.Seconds(), 'f', -1, 64))
}

// closeAfterTimeout ends an HTTP/1 connection with its 408: the rest of the
// body may still be on its way and must not be read as the next request.
// (net/http would close it anyway; the header tells the client.) Not on
// HTTP/2, where the stream ends by itself and Connection: close would shut
// down the client's other streams too.
func closeAfterTimeout(w http.ResponseWriter, r *http.Request, status int) {
	if status == http.StatusRequestTimeout && r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

// deadlineBody notes when the body's deadline cut it off.
type deadlineBody struct {
	io.ReadCloser
	state *bodyState
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.state.timedOut.Store(true)
	}
	return n, err
}

// plainText reports whether s is valid UTF-8 without control characters:
// text that may be looked up in the database (PostgreSQL refuses invalid
// UTF-8 and U+0000 in text, which would be a 500).
func plainText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// plainPath answers 404 to a request whose path is not plain text: no
// resource has such a name. Under /api and /agent it runs after
// authentication (skip), so an anonymous caller still gets only 401 there.
func (h *handler) plainPath(skip func(path string) bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !plainText(r.URL.Path) && (skip == nil || !skip(r.URL.Path)) {
				h.notFound(w, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// loggedPath is the path as the request log shows it: a reveal handle in
// the path is a one-time credential and is never written out — nor is
// one in a mistyped path, nor a sealed handle pasted into one (any
// segment that holds a handle's prefix, escaped or not, is masked).
func loggedPath(p string) string {
	if strings.HasPrefix(p, "/api/v1/reveals/") {
		return "/api/v1/reveals/[handle]"
	}
	lower := strings.ToLower(p)
	if !strings.Contains(lower, "nw-reveal") && !strings.Contains(lower, "nw-sealed") {
		return p
	}
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		l := strings.ToLower(seg)
		if strings.Contains(l, "nw-reveal") || strings.Contains(l, "nw-sealed") {
			segs[i] = "[handle]"
		}
	}
	return strings.Join(segs, "/")
}
