package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

func decodeString(body string, v any) error {
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader([]byte(body)))
	r.Header.Set("Content-Type", "application/json")
	return decodeJSON(r, v, false)
}

type shapeBody struct {
	Name     string            `json:"name"`
	Count    int               `json:"count"`
	When     time.Time         `json:"when"`
	Optional *string           `json:"optional"`
	Tags     []string          `json:"tags"`
	Labels   map[string]string `json:"labels"`
	Inner    *struct {
		Value string `json:"value"`
	} `json:"inner"`
	// Opaque: read whole by the walk (opaqueValue), checked on its text.
	Payload json.RawMessage `json:"payload"`
	Any     any             `json:"any"`
}

func TestDecodeJSONShape(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body string
		code       errcode.Code
		field      string
	}{
		{"Exact", `{"name":"x","count":1,"tags":["a"],"labels":{"k":"v"},"inner":{"value":"v"}}`, "", ""},
		{"FieldInAnotherCase", `{"NAME":"x"}`, errcode.InvalidJSON, ""},
		{"NestedFieldInAnotherCase", `{"inner":{"Value":"x"}}`, errcode.InvalidJSON, ""},
		{"RepeatedField", `{"name":"a","name":"b"}`, errcode.InvalidJSON, ""},
		{"RepeatedMapKey", `{"labels":{"k":"a","k":"b"}}`, errcode.InvalidJSON, ""},
		{"NullString", `{"name":null}`, errcode.ValidationFailed, "name"},
		{"NullNumber", `{"count":null}`, errcode.ValidationFailed, "count"},
		{"NullTime", `{"when":null}`, errcode.ValidationFailed, "when"},
		{"NullOptional", `{"optional":null}`, errcode.ValidationFailed, "optional"},
		{"NullArray", `{"tags":null}`, errcode.ValidationFailed, "tags"},
		{"NullArrayItem", `{"tags":["a",null]}`, errcode.ValidationFailed, "tags/1"},
		{"NullMapValue", `{"labels":{"k":null}}`, errcode.ValidationFailed, "labels/k"},
		{"NullObject", `{"inner":null}`, errcode.ValidationFailed, "inner"},
		{"NullBody", `null`, errcode.InvalidJSON, ""},
		{"InvalidUTF8Value", "{\"name\":\"a\xff\"}", errcode.ValidationFailed, "name"},
		{"InvalidUTF8InArray", "{\"tags\":[\"ok\",\"\xc3\"]}", errcode.ValidationFailed, "tags/1"},
		{"InvalidUTF8MapKey", "{\"labels\":{\"\xfe\":\"v\"}}", errcode.ValidationFailed, "labels"},
		{"NULInValue", `{"name":"a\u0000"}`, errcode.ValidationFailed, "name"},
		{"NULInMapKey", `{"labels":{"k\u0000":"v"}}`, errcode.ValidationFailed, "labels"},
		{"InvalidUTF8FieldName", "{\"na\xffme\":\"v\"}", errcode.InvalidJSON, ""},
		{"Opaque", `{"payload":{"a":[1,"x",{"b":null}],"c":"\u00e9"},"any":[true]}`, "", ""},
		{"OpaqueEscapedBackslashBeforeU0000", `{"payload":{"p":"C:\\u0000"},"any":"\\u0000"}`, "", ""},
		{"NullOpaque", `{"payload":null}`, errcode.ValidationFailed, "payload"},
		{"NullInterface", `{"any":null}`, "", ""},
		{"NULInOpaqueValue", `{"name":"x","payload":{"p":["a\u0000"]}}`, errcode.ValidationFailed, "payload"},
		{"NULInOpaqueKey", `{"payload":{"k\u0000":1}}`, errcode.ValidationFailed, "payload"},
		{"NULInOpaqueString", `{"any":"\\\u0000"}`, errcode.ValidationFailed, "any"},
		{"InvalidUTF8InOpaque", "{\"payload\":{\"p\":\"\xff\"}}", errcode.ValidationFailed, "payload"},
		{"InvalidUTF8InOpaqueKey", "{\"name\":\"x\",\"any\":{\"\xfe\":1}}", errcode.ValidationFailed, "any"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var v shapeBody
			err := decodeString(tc.body, &v)
			if tc.code == "" {
				require.NoError(t, err)
				return
			}
			var e *errcode.Error
			require.True(t, errors.As(err, &e), "err %v", err)
			require.Equal(t, tc.code, e.Code, e.Message)
			if tc.field != "" {
				require.NotEmpty(t, e.Fields)
				require.Equal(t, tc.field, e.Fields[0].Field)
			}
		})
	}
}

// The contract's nullable request fields accept null; their siblings do not.
func TestDecodeJSONNullableFields(t *testing.T) {
	t.Parallel()
	var req api.EnrollRequest
	require.NoError(t, decodeString(`{"node_id":"n","generation":1,"enrollment_token":"t","agent_version":"v",
		"facts":{"hostname":"h","os":"linux","arch":"amd64","cpus":1,"memory_bytes":1,"agent_version":"v","runtimes":null,"observed_at":"2026-01-01T00:00:00Z"},
		"unacknowledged_results":null}`, &req))
	var ev api.EventsRequest
	require.NoError(t, decodeString(`{"events":[{"id":"e","kind":"workload","observed_at":"2026-01-01T00:00:00Z",
		"workload":{"run_id":"r","attempt_id":"a","state":"running","exit_code":null,"observed_at":"2026-01-01T00:00:00Z"}}]}`, &ev))
	err := decodeString(`{"node_id":"n","generation":1,"enrollment_token":"t","agent_version":"v","facts":{"hostname":null}}`, &req)
	require.Equal(t, errcode.ValidationFailed, errcode.Of(err))
	require.Equal(t, "facts/hostname", err.(*errcode.Error).Fields[0].Field)
}

// FuzzDecodeJSON: no body makes the decoder panic or fail without a code,
// and nothing it accepts holds invalid UTF-8 or, in any string or key
// (opaque values included), U+0000.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"name":"x","count":1,"tags":["a"],"labels":{"k":"v"},"inner":{"value":"v"}}`,
		`{"payload":{"p":["a\\u0000","\u00e9"]},"any":{"k":null}}`,
		`{"NAME":"x"}`, `{"name":null}`, `{"labels":{"k":"a","k":"b"}}`, "{\"name\":\"\xff\"}", `null`, `[]`, `{"inner":{"value":{}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var v shapeBody
		err := decodeString(string(body), &v)
		if err != nil {
			var e *errcode.Error
			require.True(t, errors.As(err, &e), "every refusal has a code: %v", err)
			require.Contains(t, []errcode.Code{errcode.InvalidJSON, errcode.ValidationFailed, errcode.UnsupportedMediaType}, e.Code)
			return
		}
		require.True(t, utf8.Valid(body), "invalid UTF-8 was accepted")
		var back any
		require.NoError(t, json.Unmarshal(body, &back))
		require.False(t, holdsNUL(back), "U+0000 was accepted")
	})
}

// holdsNUL reports whether a decoded JSON value holds U+0000 in a string
// or key.
func holdsNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.IndexByte(v, 0) >= 0
	case []any:
		return slices.ContainsFunc(v, holdsNUL)
	case map[string]any:
		for k, e := range v {
			if holdsNUL(k) || holdsNUL(e) {
				return true
			}
		}
	}
	return false
}

func TestDisplayable(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"ci", "déploiement — 部署 🚀", "a b", "Ωmega"} {
		require.True(t, displayable(s), "%q", s)
	}
	for _, s := range []string{"a\x00", "a\tb", "a\nb", "\x7f", "\u0085", "a\u202eb", "\u202a", "\u2066x", "\u2069", "\u200e", "\u200f", "\u061c",
		"a\u2028b", "\u2029", "\ufffd", "bad\xff", "\xc3"} {
		require.False(t, displayable(s), "%q", s)
	}
}

// BenchmarkDecodeSubmit decodes a submit whose operation (opaque here, read
// by the ledger) is a configuration document of about 6 KB and 250 KB:
// what checkShape spends on the operation is what opaqueValue saves.
func BenchmarkDecodeSubmit(b *testing.B) {
	for _, keys := range []int{100, 4000} {
		doc := map[string]any{}
		for i := range keys {
			doc[fmt.Sprintf("key-%04d", i)] = map[string]any{"port": 8000 + i, "host": "backend.example", "enabled": i%2 == 0}
		}
		op, err := json.Marshal(map[string]any{"format": "test/v1", "document": doc})
		require.NoError(b, err)
		body := []byte(`{"request_id":"r-1","kind":"fleet.configure","targets":[{"kind":"fleet"}],"operation":` + string(op) + `}`)
		b.Run(fmt.Sprintf("%dKB", len(body)/1000), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				var v submitBody
				if err := decodeJSON(r, &v, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
