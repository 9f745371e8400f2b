package ledger

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nodeward/nodeward/auth"
)

// Credential kinds (family credentials, administrators only) create
// package hosts, mint their tokens and revoke them. They run on the
// control plane inside the transaction that ends them, so a host's change
// and its admin audit row commit with the operation's end, or not at all.
//
// A token never enters the ledger: the result records the host (id, name,
// families, generation), and the token is re-derived from the operation
// id and that generation by auth.Service.PackageHostToken for the call
// that submitted it (the wrapper POST /api/v1/package-hosts, and the
// one-time reveal handles of DECISIONS.md §16 and §37).
const (
	KindCredentialIssue  = "credential.issue"
	KindCredentialRevoke = "credential.revoke"
)

// IssueOperation is credential.issue's operation: {name, families} with no
// target creates a host; an empty operation with one target {kind:
// package_host, id} mints a new token for that host at a new generation
// (DECISIONS.md §39).
type IssueOperation struct {
	Name     string   `json:"name,omitempty"`
	Families []string `json:"families,omitempty"`
}

// RevokeOperation is credential.revoke's operation (empty; the target
// names the host).
type RevokeOperation struct{}

// PackageHostResult is what the credential kinds record: the host as it
// stands after the operation, never its token.
type PackageHostResult struct {
	PackageHostID string   `json:"package_host_id"`
	Name          string   `json:"name"`
	Families      []string `json:"families"`
	Generation    int64    `json:"generation"`
	Revoked       bool     `json:"revoked"`
}

func packageHostResult(h auth.PackageHost) json.RawMessage {
	return mustJSON(PackageHostResult{PackageHostID: h.ID, Name: h.Name, Families: h.Families,
		Generation: h.Generation, Revoked: h.RevokedAt != nil})
}

// onePackageHostTarget requires exactly one package host target and
// answers its id.
func onePackageHostTarget(d *Draft) (string, error) {
	if len(d.Targets) != 1 || d.Targets[0].Kind != TargetPackageHost || d.Targets[0].ID == "" {
		return "", validation("targets", "exactly one target {kind: package_host, id}")
	}
	return d.Targets[0].ID, nil
}

// FieldToken names the secret credential.issue generates (its reveal
// handle's field): the package host's token.
const FieldToken = "token"

// CredentialKinds are the kinds of family credentials, carried out by a.
func CredentialKinds(a *auth.Service) []*Kind {
	return []*Kind{
		{
			Name: KindCredentialIssue, Family: FamilyCredentials, AdminOnly: true, TargetKinds: packageHostTarget,
			Prepare: func(ctx context.Context, d *Draft) error {
				var o IssueOperation
				if err := DecodeOperation(d.Operation, &o); err != nil {
					return err
				}
				if len(d.Targets) > 0 {
					if o.Name != "" || o.Families != nil {
						return validation("operation", "empty when a target names an existing package host")
					}
					id, err := onePackageHostTarget(d)
					if err != nil {
						return err
					}
					_, err = a.PackageHost(ctx, id)
					return err
				}
				fams, err := a.CheckNewPackageHost(ctx, o.Name, o.Families, "operation/")
				if err != nil {
					return err
				}
				// The identity is fixed before anything is recorded, so the
				// operation is listed under its host and a re-run after a
				// crash creates the same one.
				d.Targets = []Target{{Kind: TargetPackageHost, ID: auth.NewPackageHostID()}}
				d.Operation, err = Canonical(mustJSON(IssueOperation{Name: o.Name, Families: fams}))
				return err
			},
			RunTx: func(ctx context.Context, tx Tx, op Operation) (json.RawMessage, error) {
				var o IssueOperation
				if err := DecodeOperation(op.Operation, &o); err != nil {
					return nil, err
				}
				var h auth.PackageHost
				var err error
				if o.Name != "" {
					h, err = a.CreatePackageHostTx(ctx, tx.Auth(), op.PrincipalName, op.ID, op.TargetID, o.Name, o.Families)
				} else {
					h, err = a.IssuePackageHostTokenTx(ctx, tx.Auth(), op.PrincipalName, op.ID, op.TargetID)
				}
				if err != nil {
					return nil, err
				}
				return packageHostResult(h), nil
			},
			Reveals: []string{FieldToken},
			Reveal: func(ctx context.Context, op Operation, field string) (string, error) {
				r, err := ResultPackageHost(op)
				if err != nil {
					return "", err
				}
				return a.PackageHostToken(ctx, op.ID, r.PackageHostID, r.Generation)
			},
		},
		{
			Name: KindCredentialRevoke, Family: FamilyCredentials, AdminOnly: true, TargetKinds: packageHostTarget,
			Prepare: func(ctx context.Context, d *Draft) error {
				var o RevokeOperation
				if err := DecodeOperation(d.Operation, &o); err != nil {
					return err
				}
				id, err := onePackageHostTarget(d)
				if err != nil {
					return err
				}
				_, err = a.PackageHost(ctx, id)
				return err
			},
			RunTx: func(ctx context.Context, tx Tx, op Operation) (json.RawMessage, error) {
				h, err := a.RevokePackageHostTx(ctx, tx.Auth(), op.PrincipalName, op.ID, op.TargetID)
				if err != nil {
					return nil, err
				}
				return packageHostResult(h), nil
			},
		},
	}
}

// CheckPackageHostCurrent is the Options.CheckPrincipal the server uses: a
// package host's submission is recorded only while the generation its
// token carried is still the host's (auth.CheckPackageHostCurrentTx).
func CheckPackageHostCurrent(ctx context.Context, tx Tx, p Principal) error {
	if p.Kind != PrincipalPackageHost {
		return nil
	}
	return auth.CheckPackageHostCurrentTx(ctx, tx.Auth(), p.ID, p.Generation)
}

// ResultPackageHost decodes a credential operation's result. Errors: the
// operation did not succeed, or is not a credential kind.
func ResultPackageHost(op Operation) (PackageHostResult, error) {
	var r PackageHostResult
	if op.State != StateSucceeded || (op.Kind != KindCredentialIssue && op.Kind != KindCredentialRevoke) {
		return r, errors.New("ledger: not a succeeded credential operation")
	}
	err := json.Unmarshal(op.Result, &r)
	return r, err
}
