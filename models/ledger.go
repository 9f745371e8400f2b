package models

import "time"

// Operation is a row of operations: one request of the ledger.
type Operation struct {
	Seq                   int64  `gorm:"primaryKey;autoIncrement"`
	ID                    string `gorm:"column:id"`
	RequestID             string
	Digest                string
	PrincipalKind         string
	PrincipalID           string
	PrincipalName         string
	PackageHostGeneration int64
	Family                string
	Kind                  string
	State                 string
	Terminal              bool
	Channel               string
	Attempt               int
	Targets               string
	TargetKind            string
	TargetID              string
	ParentID              *string
	Held                  bool
	Counts                *string
	Reason                string
	Operation             string
	BodyDigest            *string // names a shared operation (operation_bodies); Operation is then empty
	Result                *string
	ErrorCode             *string
	ErrorMessage          *string
	ErrorRetryable        *bool
	Evidence              *string
	CancelRequestedAt     *time.Time
	CancelReason          string
	Owner                 string
	CreatedAt             time.Time `gorm:"autoCreateTime:false"`
	AcceptedAt            *time.Time
	FinishedAt            *time.Time
	Deadline              time.Time
	UpdatedAt             time.Time `gorm:"autoUpdateTime:false"` // the domain stamps it
}

// OperationEvent is a row of operation_events: one step of an operation's
// history.
type OperationEvent struct {
	Seq         int64 `gorm:"primaryKey;autoIncrement"`
	OperationID string
	Type        string
	At          time.Time
	Data        string
}

// OperationOwner is a row of operation_owners: a replica's lease on the
// operations it runs.
type OperationOwner struct {
	Replica   string `gorm:"primaryKey"`
	ExpiresAt time.Time
}
