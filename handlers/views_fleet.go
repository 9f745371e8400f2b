package handlers

import (
	"encoding/json"
	"time"

	"github.com/nodeward/nodeward/fleet"
)

// JSON shapes of the fleet's records (openapi.yaml: Node, Command, Offer).

type diskView struct {
	State      string     `json:"state"`
	FreeBytes  *int64     `json:"free_bytes,omitempty"`
	ObservedAt *time.Time `json:"observed_at,omitempty"`
}

type purchaseView struct {
	BillingIntervalSeconds *int64     `json:"billing_interval_seconds,omitempty"`
	EligibleClasses        []string   `json:"eligible_classes"`
	AvailableUntil         *time.Time `json:"available_until,omitempty"`
}

type nodeView struct {
	NodeID          string          `json:"node_id"`
	RentalID        string          `json:"rental_id"`
	Generation      int64           `json:"generation"`
	State           string          `json:"state"`
	FencingToken    int64           `json:"fencing_token"`
	CreatedAt       time.Time       `json:"created_at"`
	EnrolledAt      *time.Time      `json:"enrolled_at"`
	LeaseExpiresAt  *time.Time      `json:"lease_expires_at"`
	LastHeartbeatAt *time.Time      `json:"last_heartbeat_at"`
	RetiredAt       *time.Time      `json:"retired_at"`
	AgentVersion    string          `json:"agent_version"`
	Facts           json.RawMessage `json:"facts"`
	FactsObservedAt *time.Time      `json:"facts_observed_at"`
	FactsReceivedAt *time.Time      `json:"facts_received_at"`
	Disk            diskView        `json:"disk"`
	PriceUSD        *float64        `json:"shadow_price_usd_per_hour"`
	Purchase        purchaseView    `json:"purchase"`
	// Capabilities is null while the node never reported facts.
	Capabilities []string `json:"capabilities"`
}

func priceUSD(micros *int64) *float64 {
	if micros == nil {
		return nil
	}
	v := float64(*micros) / 1e6
	return &v
}

func viewNode(n fleet.Node) nodeView {
	facts := n.Facts
	if len(facts) == 0 {
		facts = json.RawMessage("null")
	}
	classes := n.Purchase.EligibleClasses
	if classes == nil {
		classes = []string{}
	}
	caps, _ := n.Capabilities()
	return nodeView{
		Capabilities: caps,
		NodeID:       n.ID, RentalID: n.RentalID, Generation: n.Generation, State: string(n.State), FencingToken: n.FencingToken,
		CreatedAt: n.CreatedAt, EnrolledAt: n.EnrolledAt, LeaseExpiresAt: n.LeaseExpiresAt, LastHeartbeatAt: n.LastHeartbeatAt,
		RetiredAt: n.RetiredAt, AgentVersion: n.AgentVersion, Facts: facts, FactsObservedAt: n.FactsObservedAt,
		FactsReceivedAt: n.FactsReceivedAt,
		Disk:            diskView{State: n.Disk.State, FreeBytes: n.Disk.FreeBytes, ObservedAt: n.Disk.ObservedAt},
		PriceUSD:        priceUSD(n.PriceMicros),
		Purchase: purchaseView{BillingIntervalSeconds: n.Purchase.BillingIntervalSeconds, EligibleClasses: classes,
			AvailableUntil: n.Purchase.AvailableUntil},
	}
}

type commandView struct {
	OperationID     string          `json:"operation_id"`
	NodeID          string          `json:"node_id"`
	Kind            string          `json:"kind"`
	State           string          `json:"state"`
	FencingToken    int64           `json:"fencing_token"`
	IssuedAt        time.Time       `json:"issued_at"`
	Payload         json.RawMessage `json:"payload"`
	FailureCode     string          `json:"failure_code,omitempty"`
	FailureMessage  string          `json:"failure_message,omitempty"`
	DeliveredAt     *time.Time      `json:"delivered_at,omitempty"`
	LastDeliveredAt *time.Time      `json:"last_delivered_at,omitempty"`
	SettledAt       *time.Time      `json:"settled_at,omitempty"`
	DeliveryCount   int             `json:"delivery_count"`
}

func viewCommand(c fleet.Command) commandView {
	return commandView{OperationID: c.OperationID, NodeID: c.NodeID, Kind: c.Kind, State: string(c.State),
		FencingToken: c.FencingToken, IssuedAt: c.IssuedAt, Payload: c.Payload, FailureCode: c.FailureCode,
		FailureMessage: c.FailureMessage, DeliveredAt: c.FirstDeliveredAt, LastDeliveredAt: c.LastDeliveredAt,
		SettledAt: c.SettledAt, DeliveryCount: c.DeliveryCount}
}

type workloadView struct {
	RunID      string     `json:"run_id"`
	AttemptID  string     `json:"attempt_id"`
	State      string     `json:"state"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	ObservedAt *time.Time `json:"observed_at,omitempty"`
	ReceivedAt *time.Time `json:"received_at,omitempty"`
}

func viewWorkload(w fleet.Workload) workloadView {
	v := workloadView{RunID: w.RunID, AttemptID: w.AttemptID, State: w.State, ExitCode: w.ExitCode}
	if !w.ObservedAt.IsZero() {
		o, r := w.ObservedAt, w.ReceivedAt
		v.ObservedAt, v.ReceivedAt = &o, &r
	}
	return v
}

type offerView struct {
	NodeID                 string     `json:"node_id"`
	RentalID               string     `json:"rental_id"`
	Generation             int64      `json:"generation"`
	PriceUSD               float64    `json:"shadow_price_usd_per_hour"`
	BillingIntervalSeconds *int64     `json:"billing_interval_seconds,omitempty"`
	CommittedUntil         *time.Time `json:"committed_until,omitempty"`
	EligibleClasses        []string   `json:"eligible_classes"`
	AvailableUntil         *time.Time `json:"available_until,omitempty"`
	Disk                   diskView   `json:"disk"`
	LeaseExpiresAt         *time.Time `json:"lease_expires_at"`
}

func viewOffer(o fleet.Offer) offerView {
	n := o.Node
	classes := n.Purchase.EligibleClasses
	if classes == nil {
		classes = []string{}
	}
	return offerView{NodeID: n.ID, RentalID: n.RentalID, Generation: n.Generation, PriceUSD: *priceUSD(n.PriceMicros),
		BillingIntervalSeconds: n.Purchase.BillingIntervalSeconds, CommittedUntil: o.CommittedUntil,
		EligibleClasses: classes, AvailableUntil: n.Purchase.AvailableUntil,
		Disk:           diskView{State: n.Disk.State, FreeBytes: n.Disk.FreeBytes, ObservedAt: n.Disk.ObservedAt},
		LeaseExpiresAt: n.LeaseExpiresAt}
}
