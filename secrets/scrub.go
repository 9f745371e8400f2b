package secrets

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Placeholder replaces a known secret value in stored text (ARCHITECTURE.md
// §4 "Scrub").
const Placeholder = "[secret]"

// Scrub answers text with every occurrence of each value replaced by
// Placeholder, in any of the forms a program commonly writes it: as is,
// and as a JSON string encodes it (Go's encoder, which escapes <, > and
// &; without that; and with every non-ASCII character as \uXXXX, as
// Python's json.dumps does), since hooks and workloads print the JSON
// they were given. Longer forms go first, so a value containing another is
// replaced whole. Where the text was cut (its start, and just after each
// "…", the mark of a cut tail) a trailing fragment of a value, CutFragment
// bytes or more, is replaced too: a tail that begins inside a secret must
// not keep the rest of it. This is the one place secret values are
// removed from text; everything that stores results, errors, evidence,
// node failure text or workload output goes through it.
func Scrub(text string, values []string) string {
	if text == "" || len(values) == 0 {
		return text
	}
	forms := encodedForms(values)
	return scrubCutFragments(replaceForms(text, forms), forms)
}

// replaceForms replaces every whole occurrence of each form, longest
// first (encodedForms' order).
func replaceForms(text string, forms []string) string {
	for _, f := range forms {
		text = strings.ReplaceAll(text, f, Placeholder)
	}
	return text
}

// CutFragment is the shortest end of a secret value Scrub removes from
// where text was cut: shorter ones match ordinary text too often to tell.
const CutFragment = 4

// cutMark starts a tail that was cut (the agent's hook output, workload
// output).
const cutMark = "…"

func scrubCutFragments(text string, forms []string) string {
	starts := []int{0}
	for i := 0; ; {
		j := strings.Index(text[i:], cutMark)
		if j < 0 {
			break
		}
		i += j + len(cutMark)
		starts = append(starts, i)
	}
	// Last first, so each replacement leaves the earlier starts in place.
	for k := len(starts) - 1; k >= 0; k-- {
		at := starts[k]
		if n := fragmentAt(text[at:], forms); n > 0 {
			text = text[:at] + Placeholder + text[at+n:]
		}
	}
	return text
}

// fragmentAt answers the length of the longest proper end of a form, at
// least CutFragment bytes long, that text begins with (0: none).
func fragmentAt(text string, forms []string) int {
	best := 0
	for _, f := range forms {
		for n := min(len(f)-1, len(text)); n >= CutFragment && n > best; n-- {
			if strings.HasPrefix(text, f[len(f)-n:]) {
				best = n
				break
			}
		}
	}
	return best
}

// encodedForms answers each non-empty value in the forms Scrub looks
// for, without repeats, longest first.
func encodedForms(values []string) []string {
	seen := map[string]bool{}
	var forms []string
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			forms = append(forms, f)
		}
	}
	for _, v := range values {
		if v == "" {
			continue
		}
		add(v)
		html, plain := jsonInner(v, true), jsonInner(v, false)
		add(html)
		add(plain)
		add(asciiOnly(plain))
		add(asciiOnly(html))
	}
	sort.SliceStable(forms, func(i, j int) bool { return len(forms[i]) > len(forms[j]) })
	return forms
}

// jsonInner answers v as a JSON string encodes it, without the quotes.
func jsonInner(v string, escapeHTML bool) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	if enc.Encode(v) != nil {
		return ""
	}
	out := strings.TrimSuffix(b.String(), "\n")
	return out[1 : len(out)-1]
}

// asciiOnly escapes every non-ASCII character of a JSON string's inside
// as \uXXXX (UTF-16, so a surrogate pair above U+FFFF).
func asciiOnly(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, "\\u%04x\\u%04x", hi, lo)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// ScrubJSON answers a JSON document with Scrub applied to every string in
// it (keys included), so a value is found however JSON escapes it. A
// document that does not decode is scrubbed as text.
func ScrubJSON(raw json.RawMessage, values []string) json.RawMessage {
	if len(raw) == 0 || len(values) == 0 {
		return raw
	}
	doc, err := decode(raw)
	if err != nil {
		return json.RawMessage(Scrub(string(raw), values))
	}
	// A document's strings were not cut: only whole values are replaced.
	forms := encodedForms(values)
	whole := func(s string) string { return replaceForms(s, forms) }
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			return whole(x)
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[whole(k)] = walk(e)
			}
			return out
		}
		return v
	}
	b, err := json.Marshal(walk(doc))
	if err != nil {
		return json.RawMessage(Scrub(string(raw), values))
	}
	return b
}

// Values answers the secret values the operations used (their resolved
// sealed values, kept for delivery), for Scrub.
func (s *Service) Values(ctx context.Context, operationIDs ...string) ([]string, error) {
	return s.values(ctx, s.store, operationIDs)
}

// TxValues is Values read inside tx (the transaction that stores the
// text).
func (s *Service) TxValues(ctx context.Context, tx Tx, operationIDs ...string) ([]string, error) {
	return s.values(ctx, tx, operationIDs)
}

func (s *Service) values(ctx context.Context, r deliveryReader, operationIDs []string) ([]string, error) {
	var out []string
	for _, id := range operationIDs {
		if id == "" {
			continue
		}
		ds, err := r.Deliveries(ctx, id)
		if err != nil {
			return nil, err
		}
		vs, err := s.openDeliveries(ds)
		if err != nil {
			return nil, err
		}
		out = append(out, vs...)
	}
	return out, nil
}

func (s *Service) openDeliveries(ds []Delivery) ([]string, error) {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		plain, err := s.open(d.KeyID, d.Box, deliveryAAD(d.OperationID, d.Field))
		if err != nil {
			return nil, err
		}
		out = append(out, string(plain))
	}
	return out, nil
}
