package models

import "time"

// Node is a row of nodes.
type Node struct {
	ID                     string `gorm:"primaryKey"`
	RentalID               string
	Generation             int64
	State                  string
	FencingToken           int64
	CreatedAt              time.Time `gorm:"autoCreateTime:false"`
	UpdatedAt              time.Time `gorm:"autoUpdateTime:false"` // the domain stamps it
	EnrolledAt             *time.Time
	LeaseExpiresAt         *time.Time
	LastHeartbeatAt        *time.Time
	RetiredAt              *time.Time
	AgentVersion           string
	Facts                  *string
	FactsObservedAt        *time.Time
	FactsReceivedAt        *time.Time
	DiskState              string
	DiskFreeBytes          *int64
	DiskObservedAt         *time.Time
	PriceMicros            *int64
	BillingIntervalSeconds *int64
	EligibleClasses        string
	AvailableUntil         *time.Time
	EnrollNonceDigest      string
}

// Invitation is a row of invitations: an enrollment token's claims and
// digest, never the token.
type Invitation struct {
	ID          string `gorm:"primaryKey"`
	NodeID      string
	Generation  int64
	TokenDigest string
	IssuedAt    time.Time
	ExpiresAt   time.Time
	State       string
	RedeemedAt  *time.Time
}

// NodeEvent records a workload event id once per node.
type NodeEvent struct {
	NodeID     string `gorm:"primaryKey"`
	EventID    string `gorm:"primaryKey"`
	ReceivedAt time.Time
}

// Workload is the latest observation of one workload attempt.
type Workload struct {
	NodeID     string `gorm:"primaryKey"`
	RunID      string `gorm:"primaryKey"`
	AttemptID  string `gorm:"primaryKey"`
	State      string
	ExitCode   *int
	ObservedAt time.Time
	ReceivedAt time.Time
}

// WorkloadOutput is the output tails one exited attempt reported.
type WorkloadOutput struct {
	NodeID     string `gorm:"primaryKey"`
	RunID      string `gorm:"primaryKey"`
	AttemptID  string `gorm:"primaryKey"`
	StdoutTail string
	StderrTail string
	Truncated  bool
	ReceivedAt time.Time
}

// NodeStateCount is one entry of the nodes-by-state counter: triggers
// append +1/-1 as nodes change state (migration 00013), FoldNodeCounts
// folds them into one row per state.
type NodeStateCount struct {
	ID    int64 `gorm:"primaryKey"`
	State string
	N     int64
}

// TableName pins the table name.
func (NodeStateCount) TableName() string { return "node_state_counts" }

// NodeAudit is one change to a node.
type NodeAudit struct {
	ID     int64 `gorm:"primaryKey"`
	At     time.Time
	Actor  string
	Action string
	NodeID string
	Detail string
}

// TableName pins the table name.
func (NodeAudit) TableName() string { return "node_audit" }

// Command is a row of commands.
type Command struct {
	OperationID      string `gorm:"primaryKey"`
	NodeID           string
	Kind             string
	Payload          string
	PayloadDigest    string
	FencingToken     int64
	IssuedAt         time.Time
	State            string
	FailureCode      *string
	FailureMessage   *string
	DeliveredFencing *int64
	FirstDeliveredAt *time.Time
	LastDeliveredAt  *time.Time
	DeliveryCount    int
	SettledAt        *time.Time
	// PayloadBody names the payload in operation_bodies (migration 00032);
	// Payload is then empty. Set only by InsertCommands (a fan-out's
	// release), for a payload of at least sharedBodyMin.
	PayloadBody *string
}

// Replica is one control-plane process and the long-polls it holds.
type Replica struct {
	ID          string `gorm:"primaryKey"`
	StartedAt   time.Time
	HeartbeatAt time.Time
	Sessions    string
}
