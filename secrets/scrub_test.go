package secrets_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/secrets"
)

func TestScrub(t *testing.T) {
	require.Equal(t, "a [secret] b [secret]", secrets.Scrub("a abc b abcdef", []string{"abc", "abcdef"}), "longest first")
	require.Equal(t, "unchanged", secrets.Scrub("unchanged", nil))
	require.Equal(t, "x", secrets.Scrub("x", []string{""}), "an empty value removes nothing")
	got := secrets.ScrubJSON(json.RawMessage(`{"msg":"pw \"q\" here","n":1.50,"list":["pw \"q\""]}`), []string{`pw "q"`})
	require.JSONEq(t, `{"msg":"[secret] here","n":1.50,"list":["[secret]"]}`, string(got), "found however JSON escapes it")
	require.Equal(t, "not json [secret]", string(secrets.ScrubJSON(json.RawMessage(`not json v`), []string{"v"})))
}

// TestScrubEncodedForms: a hook or workload that prints the JSON it was
// given writes a value escaped; each common encoding of it is removed.
func TestScrubEncodedForms(t *testing.T) {
	const v = `p<w>&d"q\z-é-😀`
	for _, printed := range []string{
		v,
		`p\u003cw\u003e\u0026d\"q\\z-é-😀`,  // Go's encoding/json
		`p<w>&d\"q\\z-é-😀`,                 // JSON without HTML escaping
		`p<w>&d\"q\\z-\u00e9-\ud83d\ude00`, // Python's json.dumps
		`p\u003cw\u003e\u0026d\"q\\z-\u00e9-\ud83d\ude00`, // both
	} {
		out := secrets.Scrub(`{"db":{"password":"`+printed+`"}} exit 7`, []string{v})
		require.Equal(t, `{"db":{"password":"[secret]"}} exit 7`, out, "printed as %s", printed)
	}
	// Go's own encoder, whatever it escapes.
	b, err := json.Marshal(map[string]string{"pw": v})
	require.NoError(t, err)
	require.Equal(t, `{"pw":"[secret]"}`, secrets.Scrub(string(b), []string{v}))
}

// TestScrubCutFragments: a tail cut inside a secret keeps no end of it
// (at the text's start, or after the "…" that marks a cut), while a
// shorter match and a fragment elsewhere are ordinary text.
func TestScrubCutFragments(t *testing.T) {
	const v = "tailSEKRITabcdefghij"
	require.Equal(t, `[secret]"}} exit 7`, secrets.Scrub(`EKRITabcdefghij"}} exit 7`, []string{v}))
	require.Equal(t, `hook failed; output (tail): …[secret]"}}`, secrets.Scrub(`hook failed; output (tail): …ITabcdefghij"}}`, []string{v}))
	require.Equal(t, `…[secret] and [secret]`, secrets.Scrub(`…ghij and `+v, []string{v}))
	require.Equal(t, `hij then`, secrets.Scrub(`hij then`, []string{v}), "shorter than CutFragment: kept")
	require.Equal(t, `x ghij`, secrets.Scrub(`x ghij`, []string{v}), "not at a cut: kept")
	// The JSON-escaped form's end, cut (a hook printing its document).
	require.Equal(t, `…[secret]"}`, secrets.Scrub(`…\u003e-end"}`, []string{"a<b>-end"}))
	// A document's strings are not cut: ScrubJSON replaces whole values only.
	require.JSONEq(t, `{"a":"ghij"}`, string(secrets.ScrubJSON(json.RawMessage(`{"a":"ghij"}`), []string{v})))
}
