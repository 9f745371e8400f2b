package models

import "time"

// SealedSecret is a row of sealed_secrets: one sealed value, named by its
// handle's digest.
type SealedSecret struct {
	Digest        string `gorm:"primaryKey"`
	PrincipalKind string
	PrincipalID   string
	RequestID     string
	TargetKind    string
	TargetID      string
	Field         string
	KeyID         string
	Box           string
	State         string
	OperationID   string
	CreatedAt     time.Time `gorm:"autoCreateTime:false"`
	ExpiresAt     time.Time
	UsedAt        *time.Time
}

// SecretDelivery is a row of secret_deliveries: a resolved value kept for
// the node that runs its operation.
type SecretDelivery struct {
	OperationID string `gorm:"primaryKey"`
	Field       string `gorm:"primaryKey"`
	KeyID       string
	Box         string
	CreatedAt   time.Time `gorm:"autoCreateTime:false"`
}

// SecretAudit is a row of secret_audit.
type SecretAudit struct {
	Seq           int64 `gorm:"primaryKey;autoIncrement"`
	At            time.Time
	Action        string
	Outcome       string
	PrincipalKind string
	PrincipalID   string
	HandleDigest  string
	RequestID     string
	OperationID   string
	TargetKind    string
	TargetID      string
	Field         string
}

// TableName pins the table name (GORM would pluralise it).
func (SecretAudit) TableName() string { return "secret_audit" }

// RevealHandle is a row of reveal_handles: a one-time handle to a secret
// an operation generated, named by its digest; the handle itself sealed.
type RevealHandle struct {
	Digest        string `gorm:"primaryKey"`
	PrincipalKind string
	PrincipalID   string
	RequestID     string
	OperationID   string
	Field         string
	KeyID         string
	Box           string
	State         string
	CreatedAt     time.Time `gorm:"autoCreateTime:false"`
	ExpiresAt     time.Time
	SpentAt       *time.Time
}
