package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"reflect"
	"time"

	"github.com/nodeward/nodeward/errcode"
)

// DefaultBodyLimit bounds every request body (DECISIONS.md §24).
const DefaultBodyLimit = 1 << 20

// DefaultBodyReadTimeout bounds the time to receive a request body.
const DefaultBodyReadTimeout = 10 * time.Second

// decodeJSON reads the whole body into v: application/json only, unknown
// fields and trailing data refused. An empty body is allowed when
// allowEmpty holds (v is then left as it is).
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errcode.Errorf(errcode.PayloadTooLarge, "request body exceeds %d bytes", mbe.Limit)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errcode.New(errcode.InvalidJSON, "request body not received in time")
		}
		return errcode.New(errcode.InvalidJSON, "could not read request body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return errcode.New(errcode.InvalidJSON, "request body is empty; a JSON object is required")
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return errcode.New(errcode.UnsupportedMediaType, "request body must be application/json")
		}
	} else {
		return errcode.New(errcode.UnsupportedMediaType, "request body must be application/json (Content-Type missing)")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errcode.New(errcode.InvalidJSON, describeJSONError(err))
	}
	if dec.More() {
		return errcode.New(errcode.InvalidJSON, "trailing data after the JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errcode.New(errcode.InvalidJSON, "trailing data after the JSON value")
	}
	return nil
}

// describeJSONError says what was wrong without echoing values (which may be
// secrets).
func describeJSONError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %q must be %s", typ.Field, jsonKind(typ.Type))
		}
		return fmt.Sprintf("the body must be %s", jsonKind(typ.Type))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: unexpected end of input"
	}
	msg := err.Error()
	const unknown = "json: unknown field "
	if len(msg) > len(unknown) && msg[:len(unknown)] == unknown {
		return "unknown field " + msg[len(unknown):]
	}
	return "malformed JSON"
}

// jsonKind names what JSON value a Go type takes, in the caller's words.
func jsonKind(t reflect.Type) string {
	if t.PkgPath() == "time" && t.Name() == "Time" {
		return "an RFC 3339 time string"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.Struct, reflect.Map:
		return "a JSON object"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a JSON value"
		}
		return "a JSON array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a different JSON type"
}
