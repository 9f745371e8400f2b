package handlers

import (
	"sort"
	"unicode"
	"unicode/utf8"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
)

// displayable reports whether a client-supplied name is fit to show in
// the console and in listings: valid UTF-8 without control characters, the
// formatting characters that reorder text (bidirectional overrides,
// isolates and marks) or break it (line and paragraph separators), with
// which a name could pass for another or spoil the line it is shown in, or
// the replacement character.
func displayable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		// U+FFFD stands in for text that was not valid (a lone
		// surrogate escape, for one).
		if unicode.IsControl(r) || isBidiControl(r) || r == '\u2028' || r == '\u2029' || r == utf8.RuneError {
			return false
		}
	}
	return true
}

func isBidiControl(r rune) bool {
	switch {
	case r == '\u061c', r == '\u200e', r == '\u200f':
		return true
	case r >= '\u202a' && r <= '\u202e':
		return true
	case r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}

const notDisplayable = "must be valid UTF-8 text without control or bidirectional formatting characters"

// checkDisplayable records field when s is not displayable.
func checkDisplayable(v *errcode.Validation, field, s string) {
	v.Check(displayable(s), field, notDisplayable)
}

// checkFacts holds the names in a node's facts, which the console shows,
// to displayable text. (The domain bounds their count and size.)
func checkFacts(v *errcode.Validation, field string, f api.Facts) {
	checkDisplayable(v, field+"/hostname", f.Hostname)
	checkDisplayable(v, field+"/os", f.OS)
	checkDisplayable(v, field+"/arch", f.Arch)
	checkDisplayable(v, field+"/agent_version", f.AgentVersion)
	for i, rt := range f.Runtimes {
		if !displayable(rt) {
			v.Add(field+"/runtimes", "runtime %d: %s", i, notDisplayable)
			break
		}
	}
	keys := make([]string, 0, len(f.Labels))
	for k := range f.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !displayable(k) || !displayable(f.Labels[k]) {
			// The label's name is not echoed: it is the text at fault.
			v.Add(field+"/labels", "label names and values "+notDisplayable)
			break
		}
	}
}
