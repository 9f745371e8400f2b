package secrets

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
)

// Placeholder replaces a known secret value in stored text (ARCHITECTURE.md
// §4 "Scrub").
const Placeholder = "[secret]"

// Scrub answers text with every occurrence of each value replaced by
// Placeholder. Longer values go first, so a value containing another is
// replaced whole. This is the one place secret values are removed from
// text; everything that stores results, errors, evidence, node failure
// text or workload output goes through it.
func Scrub(text string, values []string) string {
	if text == "" || len(values) == 0 {
		return text
	}
	vs := append([]string(nil), values...)
	sort.Slice(vs, func(i, j int) bool { return len(vs[i]) > len(vs[j]) })
	for _, v := range vs {
		if v != "" {
			text = strings.ReplaceAll(text, v, Placeholder)
		}
	}
	return text
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
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case string:
			return Scrub(x, values)
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case map[string]any:
			out := make(map[string]any, len(x))
			for k, e := range x {
				out[Scrub(k, values)] = walk(e)
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
