package ledger_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// credBundle is a started ledger serving the node and credential kinds,
// with the server's submit-time package host check.
type credBundle struct {
	*bundle
	auth *auth.Service
}

func eachCred(t *testing.T, fn func(t *testing.T, b *credBundle)) {
	t.Helper()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		b := newLedger(t, db, newTestKinds(), newClock(), func(s *ledger.Settings) { s.PackageHostQuota = 100000 })
		a := auth.New(auth.Options{Store: models.NewAuthStore(db), Keys: keys.NewRing(bytes.Repeat([]byte{9}, 32)), Now: b.clock.Now})
		reg := b.svc.Kinds()
		for _, k := range ledger.CredentialKinds(a) {
			reg.Register(k)
		}
		// The same ledger with the server's submit-time check; the commit
		// hook newLedger set reads b.svc when it runs, so it reaches this one.
		b.svc = ledger.New(ledger.Options{Store: b.store, Kinds: reg, Settings: b.svc.Settings(), Replica: b.replica,
			Now: b.clock.Now, Metrics: b.metrics, Logger: slog.New(slog.DiscardHandler),
			CrossReplica: db.Dialect == models.Postgres, CheckPrincipal: ledger.CheckPackageHostCurrent})
		b.start(t)
		fn(t, &credBundle{bundle: b, auth: a})
	})
}

// run submits as p and waits for the end.
func (b *credBundle) run(t *testing.T, p ledger.Principal, kind string, targets []ledger.Target, op string) ledger.Operation {
	t.Helper()
	got, created, err := b.svc.Submit(ctx, p, ledger.Submission{RequestID: newRequestID(), Kind: kind, Targets: targets,
		Operation: json.RawMessage(op), Wait: 30 * time.Second})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, ledger.StateSucceeded, got.State, "operation %s: %+v", got.ID, got.Error)
	return got
}

// issue creates a host and answers it with its token.
func (b *credBundle) issue(t *testing.T, name string, families ...string) (ledger.PackageHostResult, string) {
	t.Helper()
	fams, _ := json.Marshal(families)
	op := b.run(t, admin, ledger.KindCredentialIssue, nil, `{"name":`+strconv.Quote(name)+`,"families":`+string(fams)+`}`)
	return b.token(t, op)
}

func (b *credBundle) token(t *testing.T, op ledger.Operation) (ledger.PackageHostResult, string) {
	t.Helper()
	res, err := ledger.ResultPackageHost(op)
	require.NoError(t, err)
	tok, err := b.auth.PackageHostToken(ctx, op.ID, res.PackageHostID, res.Generation)
	require.NoError(t, err)
	return res, tok
}

func hostTarget(id string) []ledger.Target {
	return []ledger.Target{{Kind: ledger.TargetPackageHost, ID: id}}
}

// asLedger is the ledger principal of an authenticated package host, as
// the HTTP edge maps it.
func asLedger(p auth.Principal) ledger.Principal {
	return ledger.Principal{Kind: ledger.PrincipalPackageHost, ID: p.PackageHostID, Name: p.PackageHostName,
		Generation: p.Generation, Families: p.Families}
}

func inviteBody() string {
	return `{"rental_id":"` + newRequestID() + `","generation":1}`
}

func auditActions(t *testing.T, a *auth.Service) []string {
	t.Helper()
	rows, err := a.AuditPage(ctx, 0, 100)
	require.NoError(t, err)
	var out []string
	for _, r := range rows {
		if strings.HasPrefix(r.Action, "package_host.") {
			out = append(out, r.Action+" "+r.Target)
		}
	}
	return out
}

func TestCredentialIssue(t *testing.T) {
	eachCred(t, func(t *testing.T, b *credBundle) {
		t.Run("CreatesAHostWhoseTokenWorks", func(t *testing.T) {
			op := b.run(t, admin, ledger.KindCredentialIssue, nil, `{"name":"deployer","families":["nodes","commands","nodes"]}`)
			res, tok := b.token(t, op)
			require.Equal(t, "deployer", res.Name)
			require.Equal(t, []string{"commands", "nodes"}, res.Families, "sorted, without repeats")
			require.Equal(t, int64(1), res.Generation)
			require.Equal(t, hostTarget(res.PackageHostID), op.Targets, "listed under its host")
			require.True(t, strings.HasPrefix(tok, "nwh_"))

			p, err := b.auth.AuthenticatePackageHost(ctx, tok)
			require.NoError(t, err)
			require.Equal(t, auth.KindPackageHost, p.Kind)
			require.Equal(t, res.PackageHostID, p.PackageHostID)
			require.Equal(t, "deployer", p.PackageHostName)
			require.Equal(t, int64(1), p.Generation)
			require.Equal(t, []string{"commands", "nodes"}, p.Families)

			// The token is nowhere in the ledger.
			stored, err := b.store.Operation(ctx, op.ID)
			require.NoError(t, err)
			evs, err := b.store.Events(ctx, op.ID, 0, 100)
			require.NoError(t, err)
			all, _ := json.Marshal([]any{stored, evs})
			require.NotContains(t, string(all), strings.TrimPrefix(tok, "nwh_"))
			require.Contains(t, auditActions(t, b.auth), "package_host.create "+res.PackageHostID)

			// The submitting call gets the token back, re-derived; another
			// operation's id derives nothing.
			again, err := b.auth.PackageHostToken(ctx, op.ID, res.PackageHostID, 1)
			require.NoError(t, err)
			require.Equal(t, tok, again)
			_, err = b.auth.PackageHostToken(ctx, "another-operation", res.PackageHostID, 1)
			requireCode(t, err, errcode.NotFound)
		})
		t.Run("ExistingHostGetsANewGeneration", func(t *testing.T) {
			res, oldTok := b.issue(t, "rotator", "nodes")
			op := b.run(t, admin, ledger.KindCredentialIssue, hostTarget(res.PackageHostID), `{}`)
			res2, newTok := b.token(t, op)
			require.Equal(t, int64(2), res2.Generation)
			require.NotEqual(t, oldTok, newTok)
			_, err := b.auth.AuthenticatePackageHost(ctx, oldTok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated, "the older token stopped")
			p, err := b.auth.AuthenticatePackageHost(ctx, newTok)
			require.NoError(t, err)
			require.Equal(t, int64(2), p.Generation)
			require.Contains(t, auditActions(t, b.auth), "package_host.issue "+res.PackageHostID)
		})
		t.Run("ConcurrentCreatesOfOneNameMakeOneHost", func(t *testing.T) {
			const n = 8
			var wg sync.WaitGroup
			ops := make([]ledger.Operation, n)
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ops[i], _, errs[i] = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindCredentialIssue,
						Operation: json.RawMessage(`{"name":"racer","families":["fleet"]}`), Wait: 30 * time.Second})
				}()
			}
			wg.Wait()
			won := 0
			for i := range n {
				switch {
				case errs[i] != nil:
					requireCode(t, errs[i], errcode.Conflict)
				case ops[i].State == ledger.StateSucceeded:
					won++
				default:
					require.Equal(t, ledger.StateFailed, ops[i].State)
					require.Equal(t, string(errcode.Conflict), ops[i].Error.Code, "the loser's effect rolled back with its end")
				}
			}
			require.Equal(t, 1, won)
			require.Equal(t, int64(1), dbtest.Count(t, b.db.DB, &models.PackageHost{}, "name = ?", "racer"))
			h, err := b.auth.ListPackageHosts(ctx, 0, 1)
			require.NoError(t, err)
			require.Equal(t, int64(1), dbtest.Count(t, b.db.DB, &models.PackageHostToken{}, "host_id = ?", h[0].ID), "one token, no strays")
		})
		t.Run("RefusalsRecordNothing", func(t *testing.T) {
			b.issue(t, "taken", "nodes")
			before := countOps(t, b.bundle)
			hosts, err := b.auth.ListPackageHosts(ctx, 0, 500)
			require.NoError(t, err)
			cases := []struct {
				name    string
				p       ledger.Principal
				targets []ledger.Target
				op      string
				code    errcode.Code
				field   string
			}{
				{"HostWithoutGrant", host("h1", "nodes"), nil, `{"name":"x","families":["nodes"]}`, errcode.PermissionDenied, ""},
				{"HostClaimingCredentials", host("h1", "credentials"), nil, `{"name":"x","families":["nodes"]}`, errcode.PermissionDenied, ""},
				{"EmptyName", admin, nil, `{"name":"","families":["nodes"]}`, errcode.ValidationFailed, "operation/name"},
				{"LongName", admin, nil, `{"name":"` + strings.Repeat("é", 65) + `","families":["nodes"]}`, errcode.ValidationFailed, "operation/name"},
				{"ControlCharacter", admin, nil, `{"name":"a\u0007b","families":["nodes"]}`, errcode.ValidationFailed, "operation/name"},
				{"BidiOverride", admin, nil, `{"name":"a\u202eb","families":["nodes"]}`, errcode.ValidationFailed, "operation/name"},
				{"InvalidUTF8", admin, nil, "{\"name\":\"a\xffb\",\"families\":[\"nodes\"]}", errcode.ValidationFailed, "operation"},
				{"PaddedName", admin, nil, `{"name":" x","families":["nodes"]}`, errcode.ValidationFailed, "operation/name"},
				{"NoFamilies", admin, nil, `{"name":"x"}`, errcode.ValidationFailed, "operation/families"},
				{"CredentialsFamily", admin, nil, `{"name":"x","families":["credentials"]}`, errcode.ValidationFailed, "operation/families"},
				{"UnknownFamily", admin, nil, `{"name":"x","families":["nodes","telepathy"]}`, errcode.ValidationFailed, "operation/families"},
				{"UnknownField", admin, nil, `{"name":"x","families":["nodes"],"token":"mine"}`, errcode.InvalidJSON, ""},
				{"NameTaken", admin, nil, `{"name":"taken","families":["nodes"]}`, errcode.Conflict, ""},
				{"UnknownHost", admin, hostTarget("nope"), `{}`, errcode.NotFound, ""},
				{"TargetAndBody", admin, hostTarget("nope"), `{"name":"x"}`, errcode.ValidationFailed, "operation"},
				{"WrongTargetKind", admin, []ledger.Target{{Kind: "node", ID: "n1"}}, `{}`, errcode.ValidationFailed, "targets"},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					_, _, err := b.svc.Submit(ctx, c.p, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindCredentialIssue,
						Targets: c.targets, Operation: json.RawMessage(c.op)})
					requireCode(t, err, c.code)
					if c.field != "" {
						var e *errcode.Error
						require.True(t, errors.As(err, &e))
						require.Equal(t, c.field, e.Fields[0].Field, "%v", err)
					}
				})
			}
			_, _, err = b.svc.Submit(ctx, host("h1", "credentials"), ledger.Submission{RequestID: newRequestID(),
				Kind: ledger.KindCredentialRevoke, Targets: hostTarget(hosts[0].ID)})
			requireCode(t, err, errcode.PermissionDenied)
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindCredentialRevoke})
			requireCode(t, err, errcode.ValidationFailed)
			require.Equal(t, before, countOps(t, b.bundle))
			after, err := b.auth.ListPackageHosts(ctx, 0, 500)
			require.NoError(t, err)
			require.Equal(t, len(hosts), len(after))
		})
	})
}

func TestCredentialRevoke(t *testing.T) {
	eachCred(t, func(t *testing.T, b *credBundle) {
		t.Run("StopsEveryToken", func(t *testing.T) {
			res, tok := b.issue(t, "revoked", "nodes")
			op := b.run(t, admin, ledger.KindCredentialRevoke, hostTarget(res.PackageHostID), `{}`)
			got, err := ledger.ResultPackageHost(op)
			require.NoError(t, err)
			require.Equal(t, int64(2), got.Generation)
			require.True(t, got.Revoked)
			_, err = b.auth.AuthenticatePackageHost(ctx, tok)
			require.ErrorIs(t, err, auth.ErrUnauthenticated)
			require.Contains(t, auditActions(t, b.auth), "package_host.revoke "+res.PackageHostID)

			// Revoking again changes nothing; a new token lifts it.
			op = b.run(t, admin, ledger.KindCredentialRevoke, hostTarget(res.PackageHostID), `{}`)
			got, _ = ledger.ResultPackageHost(op)
			require.Equal(t, int64(2), got.Generation)
			op = b.run(t, admin, ledger.KindCredentialIssue, hostTarget(res.PackageHostID), `{}`)
			got, tok = b.token(t, op)
			require.Equal(t, int64(3), got.Generation)
			require.False(t, got.Revoked)
			_, err = b.auth.AuthenticatePackageHost(ctx, tok)
			require.NoError(t, err)
		})
		t.Run("RequestInFlightIsRefused", func(t *testing.T) {
			// Authenticated before the revocation, submitting after it.
			res, tok := b.issue(t, "in-flight", "nodes")
			p, err := b.auth.AuthenticatePackageHost(ctx, tok)
			require.NoError(t, err)
			b.run(t, asLedger(p), ledger.KindNodeInvite, nil, inviteBody())
			b.run(t, admin, ledger.KindCredentialRevoke, hostTarget(res.PackageHostID), `{}`)
			before := countOps(t, b.bundle)
			_, _, err = b.svc.Submit(ctx, asLedger(p), ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite,
				Operation: json.RawMessage(inviteBody())})
			requireCode(t, err, errcode.Unauthenticated)
			require.Equal(t, before, countOps(t, b.bundle), "nothing recorded")
		})
		t.Run("ConcurrentSubmitsStopAtTheRevocation", func(t *testing.T) {
			res, tok := b.issue(t, "busy", "nodes")
			p, err := b.auth.AuthenticatePackageHost(ctx, tok)
			require.NoError(t, err)
			lp := asLedger(p)
			countHost := func() int64 {
				return dbtest.Count(t, b.db.DB, &models.Operation{}, "principal_kind = ? AND principal_id = ?", "package_host", res.PackageHostID)
			}
			const workers, maxEach = 6, 400
			var wg sync.WaitGroup
			var mu sync.Mutex
			accepted := 0
			ends := make([]error, workers)
			for i := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range maxEach {
						_, _, err := b.svc.Submit(ctx, lp, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite,
							Operation: json.RawMessage(inviteBody())})
						if err != nil {
							ends[i] = err
							return
						}
						mu.Lock()
						accepted++
						mu.Unlock()
					}
				}()
			}
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return accepted >= workers
			}, 20*time.Second, time.Millisecond, "submissions under way")
			b.run(t, admin, ledger.KindCredentialRevoke, hostTarget(res.PackageHostID), `{}`)
			atRevoke := countHost()
			wg.Wait()
			for i, err := range ends {
				require.Error(t, err, "worker %d was never refused", i)
				requireCode(t, err, errcode.Unauthenticated)
			}
			require.Equal(t, atRevoke, countHost(), "nothing recorded for the token after its revocation returned")
			require.Equal(t, int64(accepted), atRevoke)
		})
	})
}

func TestGrantableFamiliesAreTheLedgerFamilies(t *testing.T) {
	require.Equal(t,
		[]string{ledger.FamilyNodes, ledger.FamilyCommands, ledger.FamilyFleet, ledger.FamilyNodeConfig, ledger.FamilyDiagnose},
		auth.GrantableFamilies)
	require.Equal(t, ledger.FamilyCredentials, auth.AdminOnlyFamily)
}
