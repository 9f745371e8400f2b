package handlers_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// Desired configuration over HTTP (DECISIONS.md §32): every exchange is
// checked against openapi.yaml by the harness.

type nodeConfigJSON struct {
	Desired *struct {
		Revision    int64           `json:"revision"`
		Hash        string          `json:"hash"`
		Format      string          `json:"format"`
		SizeBytes   int64           `json:"size_bytes"`
		OperationID string          `json:"operation_id"`
		Document    json.RawMessage `json:"document"`
	} `json:"desired"`
	Reported *struct {
		Revision int64  `json:"revision"`
		State    string `json:"state"`
		Message  string `json:"message"`
	} `json:"reported"`
	AppliedRevision int64  `json:"applied_revision"`
	Verdict         string `json:"verdict"`
	Lagging         bool   `json:"lagging"`
}

type laggingJSON struct {
	Count         int64 `json:"count"`
	NeverReported int64 `json:"never_reported"`
	Nodes         []struct {
		NodeID          string `json:"node_id"`
		DesiredRevision int64  `json:"desired_revision"`
		AppliedRevision int64  `json:"applied_revision"`
		Verdict         string `json:"verdict"`
	} `json:"nodes"`
	NextBefore *string `json:"next_before"`
}

func configureBody(requestID, nodeID string, op map[string]any) map[string]any {
	return map[string]any{"request_id": requestID, "kind": "node.configure",
		"targets": []any{map[string]any{"kind": "node", "id": nodeID}}, "operation": op}
}

func postConfigReport(t *testing.T, s *apitest.Server, token, id string, rev int64, hash, state, msg string) {
	t.Helper()
	s.JSON(t, http.MethodPost, "/agent/v1/events", api.EventsRequest{Events: []api.Event{{ID: id, Kind: api.EventConfig,
		ObservedAt: time.Now().UTC(), Config: &api.ConfigReport{Revision: rev, Hash: hash, State: state, Message: msg}}}},
		token, http.StatusOK, nil)
}

func TestNodeConfigHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		path := "/api/v1/nodes/" + boot.NodeID + "/config"
		var cfg nodeConfigJSON
		s.Admin(t, http.MethodGet, path, nil, http.StatusOK, &cfg)
		require.Nil(t, cfg.Desired)
		require.Nil(t, cfg.Reported)
		require.Equal(t, "none", cfg.Verdict)

		var op opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("cfg-1", boot.NodeID,
			map[string]any{"format": "nginx.site/v1", "document": map[string]any{"port": 80}}), http.StatusCreated, &op)
		require.Equal(t, "pending", op.State)
		require.Equal(t, "long_poll", op.Channel)
		s.Admin(t, http.MethodGet, path, nil, http.StatusOK, &cfg)
		require.Equal(t, int64(1), cfg.Desired.Revision)
		require.Equal(t, op.OperationID, cfg.Desired.OperationID)
		require.JSONEq(t, `{"port":80}`, string(cfg.Desired.Document))

		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Empty(t, polled.Commands)
		require.NotNil(t, polled.Config)
		require.Equal(t, cfg.Desired.Hash, polled.Config.Hash)

		postConfigReport(t, s, sess.SessionToken, "rep-1", 1, polled.Config.Hash, api.ConfigApplied, "")
		s.Admin(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, http.StatusOK, &op)
		require.Equal(t, "succeeded", op.State)
		s.Admin(t, http.MethodGet, path, nil, http.StatusOK, &cfg)
		require.Equal(t, "applied", cfg.Verdict)
		require.Equal(t, int64(1), cfg.AppliedRevision)
		require.False(t, cfg.Lagging)

		// Revision 2 fails on the node: the operation fails with the
		// node's message, and the node lags.
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("cfg-2", boot.NodeID,
			map[string]any{"format": "nginx.site/v1", "document": map[string]any{"port": 81}}), http.StatusCreated, &op)
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=0", nil, sess.SessionToken, http.StatusOK, &polled)
		require.Equal(t, int64(2), polled.Config.Revision)
		postConfigReport(t, s, sess.SessionToken, "rep-2", 2, polled.Config.Hash, api.ConfigFailed, "port 81 is taken")
		s.Admin(t, http.MethodGet, "/api/v1/operations/"+op.OperationID, nil, http.StatusOK, &op)
		require.Equal(t, "failed", op.State)
		var lag laggingJSON
		s.Admin(t, http.MethodGet, "/api/v1/config/lagging", nil, http.StatusOK, &lag)
		require.Equal(t, int64(1), lag.Count)
		require.Len(t, lag.Nodes, 1)
		require.Equal(t, boot.NodeID, lag.Nodes[0].NodeID)
		require.Equal(t, "failed", lag.Nodes[0].Verdict)
		require.Equal(t, int64(1), lag.Nodes[0].AppliedRevision)
		require.Nil(t, lag.NextBefore)
		s.Problem(t, http.MethodGet, "/api/v1/config/lagging?limit=0", nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
		for _, bad := range []string{"%00", "%ff", "a%20b"} {
			s.Problem(t, http.MethodGet, "/api/v1/config/lagging?before="+bad, nil, s.AdminToken, http.StatusBadRequest, "invalid_parameter")
		}
		// The gauge is read from the database at most every
		// metrics.StoreReadInterval.
		var raw []byte
		testwait.For(t, "the lagging gauge to read 1", 10*metrics.StoreReadInterval, func() bool {
			var status int
			status, _, raw = s.Do(t, http.MethodGet, "/metrics", nil, "")
			require.Equal(t, http.StatusOK, status)
			return strings.Contains(string(raw), "\nnodeward_config_lagging_nodes 1\n")
		}, func() string { return string(raw) })

		// A retired node never lags, and cannot be configured.
		s.Admin(t, http.MethodPost, "/api/v1/nodes/"+boot.NodeID+"/retire", map[string]any{}, http.StatusOK, nil)
		s.Admin(t, http.MethodGet, "/api/v1/config/lagging", nil, http.StatusOK, &lag)
		require.Zero(t, lag.Count)
		var retired nodeConfigJSON
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &retired)
		require.False(t, retired.Lagging, "the node's own read agrees with the listing")
		require.Equal(t, int64(1), retired.AppliedRevision)
		s.Problem(t, http.MethodPost, "/api/v1/operations", configureBody("cfg-3", boot.NodeID,
			map[string]any{"format": "nginx.site/v1", "document": nil}), s.AdminToken, http.StatusGone, "node_retired")
		s.Problem(t, http.MethodGet, "/api/v1/nodes/no-such-node/config", nil, s.AdminToken, http.StatusNotFound, "not_found")
	})
}

func TestNodeConfigureBadInputHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		a, _ := inviteAndEnroll(t, s)
		b, _ := inviteAndEnroll(t, s)
		before := dbtest.Count(t, s.App.DB.DB, &models.Operation{})
		one := []any{map[string]any{"kind": "node", "id": a.NodeID}}
		for i, c := range []struct {
			targets []any
			op      map[string]any
			field   string
		}{
			{one, map[string]any{"document": map[string]any{}}, "operation/format"},
			{one, map[string]any{"format": strings.Repeat("f", 200), "document": map[string]any{}}, "operation/format"},
			{one, map[string]any{"format": "f/v1"}, "operation/document"},
			{one, map[string]any{"format": "f/v1", "document": strings.Repeat("x", 300<<10)}, "operation/document"},
			{one, map[string]any{"format": "f/v1", "document": map[string]any{}, "force": "yes"}, "operation/force"},
			{append(one, map[string]any{"kind": "node", "id": b.NodeID}), map[string]any{"format": "f/v1", "document": map[string]any{}}, "targets"},
		} {
			p := s.Problem(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "bad-" + string(rune('a'+i)),
				"kind": "node.configure", "targets": c.targets, "operation": c.op}, s.AdminToken, http.StatusUnprocessableEntity, "validation_failed")
			var fields []string
			for _, e := range p.Errors {
				fields = append(fields, e.Field)
			}
			require.Contains(t, fields, c.field, "case %d", i)
		}
		require.Equal(t, before, dbtest.Count(t, s.App.DB.DB, &models.Operation{}), "nothing recorded")
	})
}

// TestSealedConfigHTTP: a sealed password in a document reaches the node's
// poll answer and nowhere else: admin reads mask it, the operation keeps
// the handle, no column holds it in clear.
func TestSealedConfigHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		secret := "pa55-" + apitest.RandomID("v")
		h := sealFor(t, s, s.AdminToken, "sealed-cfg", boot.NodeID, "/document/db/password", secret)
		var op opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("sealed-cfg", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"db": map[string]any{"user": "app", "password": h}}}),
			http.StatusCreated, &op)

		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.NotNil(t, polled.Config)
		require.JSONEq(t, `{"db":{"user":"app","password":"`+secret+`"}}`, string(polled.Config.Document), "the value reaches the node")

		var cfg nodeConfigJSON
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &cfg)
		require.JSONEq(t, `{"db":{"user":"app","password":"[sealed]"}}`, string(cfg.Desired.Document), "admin reads mask it")
		require.Equal(t, polled.Config.Hash, cfg.Desired.Hash)
		// The hash stands for the value by a keyed digest: the plain hash
		// of the document an administrator could guess is not it.
		guessed, err := fleet.ConfigHash("app/v1", json.RawMessage(`{"db":{"password":"`+secret+`","user":"app"}}`))
		require.NoError(t, err)
		require.NotEqual(t, guessed, cfg.Desired.Hash, "the hash lets nobody test a guess of the value")

		// The same value sealed again keeps the revision (the same
		// digest); another value makes a new one.
		again := sealFor(t, s, s.AdminToken, "sealed-cfg-2", boot.NodeID, "/document/db/password", secret)
		var same opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("sealed-cfg-2", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"db": map[string]any{"user": "app", "password": again}}}),
			http.StatusCreated, &same)
		var still nodeConfigJSON
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &still)
		require.Equal(t, cfg.Desired.Revision, still.Desired.Revision, "the same value is the same document")
		require.Equal(t, cfg.Desired.Hash, still.Desired.Hash)
		other := sealFor(t, s, s.AdminToken, "sealed-cfg-3", boot.NodeID, "/document/db/password", secret+"-new")
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("sealed-cfg-3", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"db": map[string]any{"user": "app", "password": other}}}),
			http.StatusCreated, &same)
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &still)
		require.Equal(t, cfg.Desired.Revision+1, still.Desired.Revision, "another value is another revision")
		// Back to the first document for what follows.
		back := sealFor(t, s, s.AdminToken, "sealed-cfg-4", boot.NodeID, "/document/db/password", secret)
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("sealed-cfg-4", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"db": map[string]any{"user": "app", "password": back}}}),
			http.StatusCreated, &same)
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.NotNil(t, polled.Config)
		require.Equal(t, cfg.Desired.Hash, polled.Config.Hash, "the same value digests alike in every revision")

		// The node's failure text is scrubbed of the value.
		postConfigReport(t, s, sess.SessionToken, "sealed-rep", polled.Config.Revision, polled.Config.Hash, api.ConfigFailed,
			"cannot log in with "+secret)
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &cfg)
		require.NotContains(t, cfg.Reported.Message, secret)

		for _, p := range []string{"/api/v1/operations/" + op.OperationID, "/api/v1/nodes/" + boot.NodeID + "/config",
			"/api/v1/node-operations?target_id=" + boot.NodeID} {
			status, _, raw := s.Do(t, http.MethodGet, p, nil, s.AdminToken)
			require.Equal(t, http.StatusOK, status)
			require.NotContains(t, string(raw), secret, p)
		}
		_, err = s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		require.NotContains(t, dumpDatabase(t, s.App.DB), secret, "no column holds the value in clear")
	})
}

// TestFirstConfigSecretScrubbedHTTP: a node's report on the first
// revision with a sealed value, which no earlier revision kept, is
// scrubbed of that value (the report reads the document only for it).
func TestFirstConfigSecretScrubbedHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		secret := "pa55-" + apitest.RandomID("v")
		h := sealFor(t, s, s.AdminToken, "first-sealed", boot.NodeID, "/document/token", secret)
		var op opJSON
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("first-sealed", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"token": h}}), http.StatusCreated, &op)
		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.NotNil(t, polled.Config)
		require.Equal(t, int64(1), polled.Config.Revision)
		postConfigReport(t, s, sess.SessionToken, "first-sealed-rep", 1, polled.Config.Hash, api.ConfigFailed,
			"token "+secret+" was refused")
		var cfg nodeConfigJSON
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &cfg)
		require.Equal(t, api.ConfigFailed, cfg.Reported.State)
		require.NotContains(t, cfg.Reported.Message, secret)
		require.Contains(t, cfg.Reported.Message, "was refused", "only the value is taken out")
	})
}

// TestReplacedConfigSecretsScrubbedHTTP: a node reports on a revision a
// later configure replaced (its hook was still running) or cleared; the
// report's message is scrubbed of the replaced revision's sealed values,
// in any encoding a hook prints them, before it is stored or shown.
func TestReplacedConfigSecretsScrubbedHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, sess := inviteAndEnroll(t, s)
		first := `old<pw>&"` + apitest.RandomID("v")
		h := sealFor(t, s, s.AdminToken, "rot-1", boot.NodeID, "/document/db/password", first)
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("rot-1", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"db": map[string]any{"password": h}}}),
			http.StatusCreated, nil)
		var polled api.CommandsResponse
		s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
		require.NotNil(t, polled.Config)
		rev1 := *polled.Config

		// Rotated while the node applies revision 1, then cleared.
		second := "new-" + apitest.RandomID("v")
		h2 := sealFor(t, s, s.AdminToken, "rot-2", boot.NodeID, "/document/db/password", second)
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("rot-2", boot.NodeID,
			map[string]any{"format": "app/v1", "document": map[string]any{"db": map[string]any{"password": h2}}}),
			http.StatusCreated, nil)
		s.Admin(t, http.MethodPost, "/api/v1/operations", configureBody("rot-3", boot.NodeID,
			map[string]any{"format": "app/v1", "document": nil}), http.StatusCreated, nil)

		printed, err := json.Marshal(map[string]any{"db": map[string]any{"password": first}})
		require.NoError(t, err)
		postConfigReport(t, s, sess.SessionToken, "rot-rep", rev1.Revision, rev1.Hash, api.ConfigFailed,
			"hook exited 7; output (tail): "+string(printed)+" and "+first+" and "+second)
		var cfg nodeConfigJSON
		s.Admin(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, http.StatusOK, &cfg)
		require.Equal(t, rev1.Revision, cfg.Reported.Revision)
		require.Equal(t, `hook exited 7; output (tail): {"db":{"password":"[secret]"}} and [secret] and [secret]`, cfg.Reported.Message)
		_, err = s.App.Secrets.Sweep(t.Context())
		require.NoError(t, err)
		dump := dumpDatabase(t, s.App.DB)
		for _, v := range []string{first, second, `\u003cpw\u003e`} {
			require.NotContains(t, dump, v, "no column holds a replaced value in clear")
		}
	})
}

// TestFleetConfigureSealedHTTP: one document with a value sealed for the
// fleet reaches every targeted node, and the fan-out ends with its counts
// — a small document sealed in each node's row, a large one sealed once
// for the nodes recorded together (fleet.SharedDocument).
func TestFleetConfigureSealedHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		for _, size := range []struct {
			name string
			pad  string
		}{{"Small", ""}, {"Large", strings.Repeat("p", 2048)}} {
			t.Run(size.name, func(t *testing.T) {
				a, sa := inviteAndEnroll(t, s)
				b, sb := inviteAndEnroll(t, s)
				requestID := "fan-cfg-" + size.name
				value := "fleet-token-" + apitest.RandomID("v")
				var sealed sealJSON
				s.Admin(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": requestID, "target": map[string]any{"kind": "fleet"},
					"field": "/document/token", "value": value}, http.StatusCreated, &sealed)
				var parent opJSON
				s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": requestID, "kind": "fleet.configure",
					"targets": []any{map[string]any{"kind": "node", "id": a.NodeID}, map[string]any{"kind": "node", "id": b.NodeID}},
					"operation": map[string]any{"format": "agent.token/v1", "document": map[string]any{"token": sealed.Handle, "pad": size.pad},
						"max_concurrency": 2}},
					http.StatusCreated, &parent)
				for _, sess := range []api.EnrollResponse{sa, sb} {
					var polled api.CommandsResponse
					deadline := time.Now().Add(30 * time.Second)
					for polled.Config == nil && time.Now().Before(deadline) {
						s.JSON(t, http.MethodGet, "/agent/v1/commands?wait=5", nil, sess.SessionToken, http.StatusOK, &polled)
					}
					require.NotNil(t, polled.Config)
					require.JSONEq(t, `{"token":"`+value+`","pad":"`+size.pad+`"}`, string(polled.Config.Document))
					postConfigReport(t, s, sess.SessionToken, "fan-"+sess.NodeID, polled.Config.Revision, polled.Config.Hash, api.ConfigApplied, "")
				}
				var done opJSON
				deadline := time.Now().Add(30 * time.Second)
				for done.State != "succeeded" && time.Now().Before(deadline) {
					s.Admin(t, http.MethodGet, "/api/v1/operations/"+parent.OperationID, nil, http.StatusOK, &done)
				}
				require.Equal(t, "succeeded", done.State)
				var cfg nodeConfigJSON
				s.Admin(t, http.MethodGet, "/api/v1/nodes/"+b.NodeID+"/config", nil, http.StatusOK, &cfg)
				require.JSONEq(t, `{"token":"[sealed]","pad":"`+size.pad+`"}`, string(cfg.Desired.Document))
				_, err := s.App.Secrets.Sweep(t.Context())
				require.NoError(t, err)
				require.NotContains(t, dumpDatabase(t, s.App.DB), value)
				var shared int64
				require.NoError(t, s.App.DB.Raw(`SELECT COUNT(*) FROM node_configs WHERE node_id IN ? AND document_id IS NOT NULL`,
					[]string{a.NodeID, b.NodeID}).Scan(&shared).Error)
				require.Equal(t, size.pad != "", shared == 2, "a large document is shared, a small one is not: %d rows name one", shared)
			})
		}
	})
}

// TestConfigPackageHostHTTP: a package host granted nodeconfig may
// configure a node; the configuration reads are for administrators.
func TestConfigPackageHostHTTP(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, _ := inviteAndEnroll(t, s)
		granted := createHost(t, s, "cfg-host", "nodeconfig")
		other := createHost(t, s, "cmd-host", "commands")
		var op opJSON
		s.JSON(t, http.MethodPost, "/api/v1/operations", configureBody("host-cfg", boot.NodeID,
			map[string]any{"format": "f/v1", "document": map[string]any{}}), granted.Token, http.StatusCreated, &op)
		require.Equal(t, "node.configure", op.Kind)
		s.Problem(t, http.MethodPost, "/api/v1/operations", configureBody("host-cfg-2", boot.NodeID,
			map[string]any{"format": "f/v1", "document": map[string]any{}}), other.Token, http.StatusForbidden, "permission_denied")
		s.Problem(t, http.MethodGet, "/api/v1/nodes/"+boot.NodeID+"/config", nil, granted.Token, http.StatusForbidden, "permission_denied")
		s.Problem(t, http.MethodGet, "/api/v1/config/lagging", nil, granted.Token, http.StatusForbidden, "permission_denied")
	})
}
