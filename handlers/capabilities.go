package handlers

import (
	"net/http"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
)

// capabilitiesView answers GET /api/v1/capabilities (DECISIONS.md §45):
// what this control plane serves, within which limits, for which agent.
type capabilitiesView struct {
	Kinds             []kindView `json:"kinds"`
	Limits            limitsView `json:"limits"`
	AgentVersion      *string    `json:"agent_version"`
	AgentCapabilities []string   `json:"agent_capabilities"`
}

type kindView struct {
	Kind           string  `json:"kind"`
	Family         string  `json:"family"`
	Capability     *string `json:"capability"`
	LevelTriggered bool    `json:"level_triggered"`
	AdminOnly      bool    `json:"admin_only"`
}

type limitsView struct {
	PackageHostQuota      int   `json:"package_host_quota"`
	NodeQuota             int   `json:"node_quota"`
	MaxWaitMs             int64 `json:"max_wait_ms"`
	DeadlineSeconds       int64 `json:"deadline_seconds"`
	OperationsKeptSeconds int64 `json:"operations_kept_seconds"`
	EventsKeptSeconds     int64 `json:"events_kept_seconds"`
	RequestBodyBytes      int64 `json:"request_body_bytes"`
	CommandPayloadBytes   int   `json:"command_payload_bytes"`
	ConfigDocumentBytes   int   `json:"config_document_bytes"`
	FactsBytes            int   `json:"facts_bytes"`
	EvidenceBytes         int   `json:"evidence_bytes"`
	SealedValueBytes      int   `json:"sealed_value_bytes"`
	EventBatch            int   `json:"event_batch"`
	MaxFanOut             int   `json:"max_fan_out"`
}

func (h *handler) capabilities(w http.ResponseWriter, r *http.Request) {
	st := h.Ledger.Settings()
	out := capabilitiesView{
		Kinds: []kindView{},
		Limits: limitsView{
			PackageHostQuota: st.PackageHostQuota, NodeQuota: st.NodeQuota,
			MaxWaitMs: st.MaxWait.Milliseconds(), DeadlineSeconds: int64(st.Deadline.Seconds()),
			OperationsKeptSeconds: int64(st.OperationsKeptFor.Seconds()), EventsKeptSeconds: int64(st.EventsKeptFor.Seconds()),
			RequestBodyBytes: h.BodyLimit, CommandPayloadBytes: fleet.MaxPayloadBytes,
			// The configuration document shares the command payload's bound
			// (DECISIONS.md §32: 256 KiB).
			ConfigDocumentBytes: fleet.MaxPayloadBytes,
			FactsBytes:          fleet.MaxFactsBytes, EvidenceBytes: api.MaxEvidenceBytes,
			SealedValueBytes: secrets.MaxValueSize, EventBatch: fleet.MaxEventBatch, MaxFanOut: ledger.MaxFanOut,
		},
		AgentCapabilities: []string{api.CapCommands, api.CapConfig, api.CapOutput, api.CapDiag},
	}
	for _, k := range h.Ledger.Kinds().Kinds() {
		kv := kindView{Kind: k.Name, Family: k.Family, LevelTriggered: k.RerunOnRecovery(), AdminOnly: k.AdminOnly}
		if k.Capability != "" {
			c := k.Capability
			kv.Capability = &c
		}
		out.Kinds = append(out.Kinds, kv)
	}
	if v := h.Fleet.Settings().AgentVersion; v != "" {
		out.AgentVersion = &v
	}
	writeJSON(w, http.StatusOK, out)
}
