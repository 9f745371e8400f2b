package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/nodeward/nodeward"
)

// Contract is a loaded, validated OpenAPI document with a router over it.
type Contract struct {
	Doc    *openapi3.T
	router routers.Router
}

// LoadContract parses and validates an OpenAPI document and builds its
// router. Errors say which part of the document is wrong.
func LoadContract(spec []byte) (*Contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("load openapi: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi document is invalid: %w", err)
	}
	if doc.Components == nil || doc.Components.Schemas["Problem"] == nil {
		return nil, errors.New("openapi document has no components.schemas.Problem")
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi router: %w", err)
	}
	return &Contract{Doc: doc, router: r}, nil
}

var (
	productOnce     sync.Once
	productContract *Contract
	productErr      error
)

// ProductContract returns the contract the server serves (nodeward.OpenAPI),
// loaded once per test binary; a broken document fails t.
func ProductContract(t testing.TB) *Contract {
	t.Helper()
	productOnce.Do(func() { productContract, productErr = LoadContract(nodeward.OpenAPI) })
	if productErr != nil {
		t.Fatalf("apitest: %v", productErr)
	}
	return productContract
}

// Violation is one disagreement between an exchange and the contract.
type Violation struct {
	Method string
	Path   string
	// Status is the answer's status (0 when the request never got one).
	Status int
	// Phase is "request" (the server accepted a request the contract
	// refuses) or "response" (the answer is not what the contract says).
	Phase string
	Err   error
}

func (v Violation) Error() string {
	return fmt.Sprintf("openapi contract violation (%s): %s %s -> %d: %v", v.Phase, v.Method, v.Path, v.Status, v.Err)
}

// Transport is an http.RoundTripper that checks every exchange against a
// Contract and reports each disagreement; it never changes what the caller
// sees. What it checks, for paths under /api/ and /agent/ and the
// operations endpoints (the console and its assets are HTML, not part of
// the contract):
//
//   - the answer's status is documented for the operation, its documented
//     headers are present and valid, and its body matches the schema of its
//     content type (text/event-stream and /metrics bodies are not read, so
//     streams stream);
//   - a request the contract refuses (bad body, unknown field, missing
//     credential, bad parameter) must not be answered 2xx: the server has
//     to refuse what the contract refuses. Refusing it with a documented
//     4xx is exactly right, so negative tests work through this transport;
//   - a path or method the contract does not document must not be answered
//     2xx, and its error answer must be a valid Problem document.
//
// Security is checked for presence only (a Bearer header or the session
// cookie, as the operation's security says); whether a credential is good
// is the server's business.
type Transport struct {
	// Base sends the requests; nil is http.DefaultTransport.
	Base http.RoundTripper
	// Contract is what exchanges are checked against.
	Contract *Contract
	// Report receives every violation.
	Report func(Violation)
}

// NewTransport returns a Transport over base (nil: a fresh clone of
// http.DefaultTransport) checking the product contract, reporting each
// violation with t.Errorf. Violations found after t has completed (a
// straggling goroutine) are dropped rather than panicking.
func NewTransport(t testing.TB, base http.RoundTripper) *Transport {
	t.Helper()
	if base == nil {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	var done atomic.Bool
	t.Cleanup(func() { done.Store(true) })
	return &Transport{
		Base:     base,
		Contract: ProductContract(t),
		Report: func(v Violation) {
			if done.Load() {
				return
			}
			t.Errorf("%v", v)
		},
	}
}

// CloseIdleConnections closes the base transport's idle connections.
func (tr *Transport) CloseIdleConnections() {
	if c, ok := tr.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (tr *Transport) base() http.RoundTripper {
	if tr.Base == nil {
		return http.DefaultTransport
	}
	return tr.Base
}

// inContract reports whether path is governed by the contract.
func inContract(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics", "/openapi.yaml", "/api":
		return true
	}
	return strings.HasPrefix(path, "/api/") || strings.HasPrefix(path, "/agent/")
}

// RoundTrip sends req and checks the exchange.
func (tr *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !inContract(req.URL.Path) {
		return tr.base().RoundTrip(req)
	}
	var reqBody []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		reqBody, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	send := withBody(req, reqBody)
	check := withBody(req, reqBody)
	// HEAD is GET without a body (RFC 9110 §9.3.2): checked as the GET
	// it stands for, its answer's headers and status only.
	head := req.Method == http.MethodHead
	if head {
		check.Method = http.MethodGet
	}

	route, input, findErr, reqErr := tr.Contract.checkRequest(check)

	resp, err := tr.base().RoundTrip(send)
	if err != nil {
		return nil, err
	}
	report := func(phase string, err error) {
		tr.Report(Violation{Method: req.Method, Path: req.URL.RequestURI(), Status: resp.StatusCode, Phase: phase, Err: err})
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	streaming := mediaType == "text/event-stream"
	var respBody []byte
	if !streaming {
		respBody, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(respBody))
	}
	success := resp.StatusCode >= 200 && resp.StatusCode < 300

	if findErr != nil {
		switch {
		case success:
			report("request", fmt.Errorf("the contract documents no such operation (%v), yet the server answered it", findErr))
		case resp.StatusCode >= 400:
			if err := tr.checkProblem(resp.Header, mediaType, respBody); err != nil {
				report("response", err)
			}
		}
		return resp, nil
	}
	if reqErr != nil && success {
		report("request", fmt.Errorf("the server accepted a request the contract refuses: %w", reqErr))
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input,
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(respBody)),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			ExcludeResponseBody:   streaming || head || req.URL.Path == "/metrics",
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(req.Context(), out); err != nil {
		report("response", err)
	} else if streaming {
		// The body is left to the caller; still, a stream must be documented.
		if r := route.Operation.Responses.Status(resp.StatusCode); r != nil && r.Value != nil && r.Value.Content.Get(mediaType) == nil {
			report("response", fmt.Errorf("response Content-Type %q is not documented for status %d", mediaType, resp.StatusCode))
		}
	}
	return resp, nil
}

// CheckRequest answers why the contract refuses req: an operation it does
// not document, or a request that operation does not accept (parameters,
// body, credentials' shape); nil when it accepts it. req's body is read.
func (c *Contract) CheckRequest(req *http.Request) error {
	_, _, findErr, reqErr := c.checkRequest(req)
	return errors.Join(findErr, reqErr)
}

// CheckValue answers why the contract's components schema named schema
// refuses v (any value encoding/json can marshal); nil when it accepts it.
// Submit bodies carry their kind's operation under an anyOf of every
// kind's schema, so a test that means one kind checks that kind's schema
// with this.
func (c *Contract) CheckValue(schema string, v any) error {
	ref := c.Doc.Components.Schemas[schema]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("openapi document has no components.schemas.%s", schema)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var generic any
	if err := json.Unmarshal(raw, &generic); err != nil {
		return err
	}
	return ref.Value.VisitJSON(generic, openapi3.MultiErrors())
}

// checkRequest finds req's operation (findErr when there is none) and
// validates req against it (reqErr).
func (c *Contract) checkRequest(req *http.Request) (route *routers.Route, input *openapi3filter.RequestValidationInput, findErr, reqErr error) {
	route, params, findErr := c.router.FindRoute(req)
	if findErr != nil {
		return nil, nil, findErr, nil
	}
	input = &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			AuthenticationFunc:                credentialPresent,
			RejectWhenRequestBodyNotSpecified: true,
			MultiError:                        true,
		},
	}
	return route, input, nil, openapi3filter.ValidateRequest(req.Context(), input)
}

// checkProblem checks an error answer to an undocumented path or method.
func (tr *Transport) checkProblem(h http.Header, mediaType string, body []byte) error {
	if mediaType != "application/problem+json" {
		return fmt.Errorf("an error answer must be application/problem+json, got %q", h.Get("Content-Type"))
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("problem body is not JSON: %w", err)
	}
	if err := tr.Contract.Doc.Components.Schemas["Problem"].Value.VisitJSON(v, openapi3.MultiErrors()); err != nil {
		return fmt.Errorf("problem body does not match #/components/schemas/Problem: %w", err)
	}
	return nil
}

// withBody returns a copy of req carrying its own reader over body.
func withBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	if body == nil {
		r.Body = http.NoBody
		r.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
		r.ContentLength = 0
		return r
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	return r
}

// credentialPresent accepts a security scheme when the request carries a
// credential of its shape; the server judges whether it is good.
func credentialPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	r := in.RequestValidationInput.Request
	s := in.SecurityScheme
	switch {
	case s.Type == "http" && strings.EqualFold(s.Scheme, "bearer"):
		v := r.Header.Get("Authorization")
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") && strings.TrimSpace(v[7:]) != "" {
			return nil
		}
		return in.NewError(errors.New("no Bearer credential in Authorization"))
	case s.Type == "apiKey" && s.In == "cookie":
		if c, err := r.Cookie(s.Name); err == nil && c.Value != "" {
			return nil
		}
		return in.NewError(fmt.Errorf("no %s cookie", s.Name))
	case s.Type == "apiKey" && s.In == "header":
		if r.Header.Get(s.Name) != "" {
			return nil
		}
		return in.NewError(fmt.Errorf("no %s header", s.Name))
	}
	return in.NewError(fmt.Errorf("apitest cannot check security scheme type %q", s.Type))
}
