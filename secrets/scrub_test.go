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
