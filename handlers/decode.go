package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
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
		if e := bodyTimeout(r, err); e != nil {
			return e
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
	return checkShape(body, reflect.TypeOf(v))
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
		return "unknown field " + clip(msg[len(unknown):], maxEchoedName)
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

// maxEchoedName bounds a client-supplied field name quoted in an answer.
const maxEchoedName = 64

// nullable lists the request fields the contract (openapi.yaml) declares
// nullable, by Go type and JSON name: there a JSON null reads as absent.
// Anywhere else null is refused (DECISIONS.md §44) rather than read as
// absent, so a client that means "no value" omits the field.
var nullable = map[reflect.Type]map[string]bool{
	reflect.TypeFor[api.Facts]():               {"runtimes": true},
	reflect.TypeFor[api.EnrollRequest]():       {"unacknowledged_results": true},
	reflect.TypeFor[api.WorkloadObservation](): {"exit_code": true},
	// Inside an operation (opaque here, read by the ledger), where null is
	// meaningful: it clears the node's configuration.
	reflect.TypeFor[ledger.ConfigureOperation]():      {"document": true},
	reflect.TypeFor[ledger.FleetConfigureOperation](): {"document": true},
}

// required lists, by Go type, the request fields the contract requires
// whose Go zero value is also a valid value, so only their absence tells
// a client that forgot them (422 naming each) from one that sent zero.
// Fields whose zero value is refused anyway are checked where they are
// read.
var required = map[reflect.Type][]string{
	// API.md: facts are {hostname, os, arch, cpus, memory_bytes,
	// disk_free_bytes?, agent_version, runtimes, labels?, observed_at}; a
	// node that left out its CPUs is not a node with none.
	reflect.TypeFor[api.Facts](): {"hostname", "os", "arch", "cpus", "memory_bytes", "agent_version", "runtimes"},
	// A result without "applied" is not a refusal.
	reflect.TypeFor[api.Result]():        {"applied"},
	reflect.TypeFor[api.ConfigReport]():  {"revision", "hash"},
	reflect.TypeFor[api.OutputRequest](): {"stdout_tail", "stderr_tail", "truncated"},
}

// checkShape reads body (already decoded into a value of type t) again and
// refuses what encoding/json lets through: a field name that matches only
// in another case and a repeated field (400 invalid_json), a null where the
// contract allows none, text that is not valid UTF-8, text holding U+0000
// and a required field left out (422 validation_failed naming each field).
// It walks the JSON alongside t; values of opaque types (json.RawMessage,
// interfaces, custom decoders) are left to whoever reads them, except for
// their text.
func checkShape(body []byte, t reflect.Type) error {
	w := shapeWalker{dec: json.NewDecoder(bytes.NewReader(body)), bad: -1}
	if !utf8.Valid(body) {
		w.bad = int64(firstInvalidUTF8(body))
	}
	w.dec.UseNumber()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if err := w.value(t, "", false); err != nil {
		return err
	}
	if w.bad >= 0 && !w.badSeen {
		return errcode.New(errcode.InvalidJSON, "the body is not valid UTF-8")
	}
	return w.v.Err()
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

type shapeWalker struct {
	dec     *json.Decoder
	bad     int64 // offset of the body's first invalid UTF-8, or -1
	badSeen bool  // bad was found inside a value and reported
	nulSeen map[string]bool
	v       errcode.Validation
}

var errShape = errcode.New(errcode.InvalidJSON, "malformed JSON")

// token reads the next token and the body range it came from (with any
// separator before it, which is ASCII).
func (w *shapeWalker) token() (json.Token, int64, int64, error) {
	start := w.dec.InputOffset()
	tok, err := w.dec.Token()
	if err != nil {
		// The body decoded once already; this cannot happen.
		return nil, 0, 0, errShape
	}
	return tok, start, w.dec.InputOffset(), nil
}

// text reports invalid UTF-8 in [start, end) against field.
func (w *shapeWalker) text(start, end int64, field string) {
	if w.bad >= start && w.bad < end && !w.badSeen {
		w.badSeen = true
		w.v.Add(fieldName(field), "must be valid UTF-8 text")
	}
}

// noNUL records against field a string token holding U+0000, which no
// text of the API needs and PostgreSQL cannot store in text.
func (w *shapeWalker) noNUL(tok json.Token, field string) {
	if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
		w.nul(field)
	}
}

// nul records, once per field, that field holds U+0000.
func (w *shapeWalker) nul(field string) {
	if w.nulSeen[field] {
		return
	}
	if w.nulSeen == nil {
		w.nulSeen = map[string]bool{}
	}
	w.nulSeen[field] = true
	w.v.Add(fieldName(field), "must not contain the character U+0000")
}

// escapesNUL reports whether the JSON text raw (valid, as decoded once
// already) holds U+0000 in a string or key. Valid JSON can write it only
// as the escape \u0000, and a backslash appears only inside a string.
func escapesNUL(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+6 <= len(raw) && raw[i+1] == 'u' && string(raw[i+2:i+6]) == "0000" {
			return true
		}
		i++ // the escaped character, which starts no escape of its own
	}
	return false
}

func fieldName(path string) string {
	if path == "" {
		return "body"
	}
	return path
}

func join(path, name string) string {
	name = clip(name, maxEchoedName)
	if path == "" {
		return name
	}
	return path + "/" + name
}

var (
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// opaque reports that values of t are decoded by something else than the
// walk follows.
func opaque(t reflect.Type) bool {
	return t == rawMessageType || t.Kind() == reflect.Interface ||
		(t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(unmarshalerType)) || t.Implements(unmarshalerType)
}

// value walks one JSON value at path against type t.
func (w *shapeWalker) value(t reflect.Type, path string, canBeNull bool) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if opaque(t) && path != "" {
		return w.opaqueValue(t, path, canBeNull)
	}
	tok, start, end, err := w.token()
	if err != nil {
		return err
	}
	if tok == nil {
		switch {
		case path == "":
			return errcode.New(errcode.InvalidJSON, "the body must be a JSON object, not null")
		case !canBeNull && t.Kind() != reflect.Interface:
			w.v.Add(path, "must not be null; omit the field to leave it out")
		}
		return nil
	}
	d, isDelim := tok.(json.Delim)
	if !isDelim {
		w.text(start, end, path)
		w.noNUL(tok, path)
		return nil
	}
	if opaque(t) {
		return w.skip(start, path)
	}
	switch {
	case d == '{' && t.Kind() == reflect.Struct:
		return w.object(t, path)
	case d == '{' && t.Kind() == reflect.Map:
		return w.mapping(t, path)
	case d == '[' && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i := 0; w.dec.More(); i++ {
			if err := w.value(t.Elem(), fmt.Sprintf("%s/%d", path, i), false); err != nil {
				return err
			}
		}
		_, _, _, err := w.token()
		return err
	}
	return w.skip(start, path)
}

func (w *shapeWalker) object(t reflect.Type, path string) error {
	fields := jsonFields(t)
	seen := make(map[string]bool)
	for w.dec.More() {
		tok, _, _, err := w.token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		f, ok := fields[key]
		if !ok {
			// encoding/json matched it to a field in another case.
			return errcode.Errorf(errcode.InvalidJSON, "unknown field %q (field names are case-sensitive)", clip(join(path, key), maxEchoedName))
		}
		if seen[key] {
			return errcode.Errorf(errcode.InvalidJSON, "field %q appears more than once", join(path, key))
		}
		seen[key] = true
		if err := w.value(f.typ, join(path, key), f.nullable); err != nil {
			return err
		}
	}
	for _, name := range required[t] {
		if !seen[name] {
			w.v.Add(join(path, name), "required")
		}
	}
	_, _, _, err := w.token()
	return err
}

func (w *shapeWalker) mapping(t reflect.Type, path string) error {
	seen := make(map[string]bool)
	for w.dec.More() {
		tok, start, end, err := w.token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		w.text(start, end, path)
		w.noNUL(key, path)
		if seen[key] {
			return errcode.Errorf(errcode.InvalidJSON, "key %q appears more than once in %s", clip(key, maxEchoedName), fieldName(path))
		}
		seen[key] = true
		if err := w.value(t.Elem(), join(path, key), false); err != nil {
			return err
		}
	}
	_, _, _, err := w.token()
	return err
}

// opaqueValue reads at path a value of opaque type t whole, and checks
// what the walk checks inside one (null, UTF-8, U+0000) on its text. An
// operation's payload is opaque and most of a submit's body, and reading
// it token by token (skip) allocated for every string and number in it.
func (w *shapeWalker) opaqueValue(t reflect.Type, path string, canBeNull bool) error {
	start := w.dec.InputOffset()
	var raw json.RawMessage
	if err := w.dec.Decode(&raw); err != nil {
		// The body decoded once already; this cannot happen.
		return errShape
	}
	if string(raw) == "null" {
		if !canBeNull && t.Kind() != reflect.Interface {
			w.v.Add(path, "must not be null; omit the field to leave it out")
		}
		return nil
	}
	w.text(start, w.dec.InputOffset(), path)
	if escapesNUL(raw) {
		w.nul(path)
	}
	return nil
}

// skip reads to the end of the object or array just opened, reporting
// invalid UTF-8 in it against path.
func (w *shapeWalker) skip(start int64, path string) error {
	for depth := 1; depth > 0; {
		tok, _, _, err := w.token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		w.noNUL(tok, path)
	}
	w.text(start, w.dec.InputOffset(), path)
	return nil
}

type jsonField struct {
	typ      reflect.Type
	nullable bool
}

var fieldCache sync.Map // reflect.Type -> map[string]jsonField

// jsonFields maps the exact JSON names of struct type t to their fields,
// as encoding/json names them (embedded structs flattened).
func jsonFields(t reflect.Type) map[string]jsonField {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]jsonField)
	}
	m := make(map[string]jsonField)
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" {
			et := sf.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, f := range jsonFields(et) {
					if _, ok := m[k]; !ok {
						m[k] = f
					}
				}
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		m[name] = jsonField{typ: sf.Type, nullable: nullable[t][name]}
	}
	fieldCache.Store(t, m)
	return m
}
