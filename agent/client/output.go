package client

import (
	"context"
	"net/http"

	"github.com/nodeward/nodeward/agent/api"
)

// Output reports an exited attempt's output tails (POST /agent/v1/output).
// Idempotent per attempt: a repeat answers Recorded false and changes
// nothing. Refusals: session_invalid (401), fenced (409), validation_failed
// (422).
func (c *Client) Output(ctx context.Context, req api.OutputRequest) (*api.OutputResponse, error) {
	var out api.OutputResponse
	if err := c.do(ctx, http.MethodPost, "/agent/v1/output", nil, req, &out, true, c.timeout); err != nil {
		return nil, err
	}
	return &out, nil
}
