package handlers_test

import (
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
)

// The decoder accepts null exactly for the request fields the contract
// marks nullable: a field marked in openapi.yaml and refused by the server
// (or the reverse) fails here rather than in a client.
func TestNullableFieldsMatchTheContract(t *testing.T) {
	t.Parallel()
	doc := apitest.ProductContract(t).Doc
	inContract := map[string]bool{}
	seen := map[*openapi3.Schema]bool{}
	var walk func(ref *openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		for name, p := range s.Properties {
			if p.Value != nil && p.Value.Nullable {
				inContract[name] = true
			}
			walk(p)
		}
		walk(s.Items)
		if s.AdditionalProperties.Schema != nil {
			walk(s.AdditionalProperties.Schema)
		}
		for _, list := range []openapi3.SchemaRefs{s.AllOf, s.OneOf, s.AnyOf} {
			for _, r := range list {
				walk(r)
			}
		}
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.RequestBody == nil || op.RequestBody.Value == nil {
				continue
			}
			if mt := op.RequestBody.Value.Content.Get("application/json"); mt != nil {
				walk(mt.Schema)
			}
		}
	}
	require.Equal(t, inContract, handlers.NullableFieldNames())
}
