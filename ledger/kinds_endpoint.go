package ledger

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/nodeward/nodeward/diagnose"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/secrets"
)

// KindDiagnoseEndpoint probes an HTTP(S) endpoint from the control plane
// (family diagnose, DECISIONS.md §46): target {kind: endpoint, id: URL},
// operation {url, credential?}. The credential, if any, is a handle sealed
// for that target and field /credential; the probe receives its value and
// nothing stores or logs it. Destinations outside the server's allowlist
// are refused at submit (403 destination_not_allowed, nothing recorded)
// and again when the probe connects (the operation fails
// destination_not_allowed). The evidence (diagnose.Evidence) is the
// result; an endpoint that cannot be reached is evidence, not a failure.
// Restart recovery may run it again (a probe changes nothing).
const KindDiagnoseEndpoint = "diagnose.endpoint"

// EndpointOperation is diagnose.endpoint's operation.
type EndpointOperation struct {
	URL string `json:"url"`
	// Credential is a sealed handle for a bearer token (never the token).
	Credential string `json:"credential,omitempty"`
}

// EndpointKind is diagnose.endpoint, probing through p; sec delivers the
// sealed credential's value to the probe.
func EndpointKind(p *diagnose.Prober, sec *secrets.Service) *Kind {
	return &Kind{
		Name: KindDiagnoseEndpoint, Family: FamilyDiagnose, TargetKinds: endpointTarget, LevelTriggered: true,
		Prepare: func(ctx context.Context, d *Draft) error {
			var o EndpointOperation
			if err := DecodeOperation(d.Operation, &o); err != nil {
				return err
			}
			var v errcode.Validation
			u, err := diagnose.ParseURL(o.URL)
			if err != nil {
				v.Add("operation/url", "%s", err.Error())
			}
			if len(d.Targets) != 1 || d.Targets[0].Kind != TargetEndpoint || d.Targets[0].ID != o.URL {
				v.Add("targets", "exactly one target {kind: endpoint, id} naming operation.url")
			}
			if o.Credential != "" && !strings.HasPrefix(o.Credential, secrets.HandlePrefix) {
				// A credential in clear would be stored in the ledger.
				v.Add("operation/credential", "a sealed handle (POST /api/v1/secrets/seal for target {kind: endpoint, id: URL}, field /credential), never the credential itself")
			}
			if err := v.Err(); err != nil {
				return err
			}
			return p.Check(ctx, u)
		},
		Run: func(ctx context.Context, op Operation) (json.RawMessage, error) {
			plain := op.Operation
			if sec != nil {
				var err error
				if plain, err = sec.Deliver(ctx, op.ID, "", op.Operation); err != nil {
					return nil, err
				}
			}
			var o EndpointOperation
			if err := json.Unmarshal(plain, &o); err != nil {
				return nil, err
			}
			if strings.HasPrefix(o.Credential, secrets.HandlePrefix) {
				return nil, errcode.New(errcode.PermissionDenied, "the sealed credential could not be delivered")
			}
			u, err := diagnose.ParseURL(o.URL)
			if err != nil {
				return nil, errcode.Errorf(errcode.ValidationFailed, "operation/url: %s", err.Error())
			}
			ev, err := p.Probe(ctx, u, o.Credential)
			if err != nil {
				return nil, err
			}
			return json.Marshal(ev)
		},
	}
}
