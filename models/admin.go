package models

import "time"

// AdminUser is an administrator who signs in to the console.
type AdminUser struct {
	ID                string `gorm:"primaryKey"`
	Username          string
	PasswordHash      string
	CreatedAt         time.Time
	DisabledAt        *time.Time
	PasswordChangedAt *time.Time
}

// APIToken is an administrator's token for scripts; only its SHA-256 is kept.
type APIToken struct {
	ID         string `gorm:"primaryKey"`
	Name       string
	UserID     string
	TokenHash  string
	CreatedAt  time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
	// RequestID is NULL for tokens made without a form's request id.
	RequestID *string
}

// ConsoleSession is one console login; the cookie's JWT names it, and
// logging out revokes the row.
type ConsoleSession struct {
	ID         string `gorm:"primaryKey"`
	UserID     string
	CreatedAt  time.Time
	ExpiresAt  time.Time
	RevokedAt  *time.Time
	RemoteAddr string
}

// AdminAudit is one row of the administrators' audit log: logins, failed
// logins, token creation and revocation. It never holds a secret. Repeated
// refusals of one client are one row: Count of them, the latest at LastAt.
type AdminAudit struct {
	ID         int64 `gorm:"primaryKey"`
	At         time.Time
	Actor      string
	Action     string
	Target     string
	Outcome    string
	RemoteAddr string
	Detail     string
	Count      int64
	LastAt     *time.Time
}

// TableName pins the table name (GORM would pluralise it).
func (AdminAudit) TableName() string { return "admin_audit" }

// PackageHost is an automation service's standing: its granted families
// (a JSON array) and the generation its tokens must carry. Seq is the
// listing's keyset cursor; ID its public identity.
type PackageHost struct {
	Seq        int64  `gorm:"primaryKey;autoIncrement"`
	ID         string `gorm:"column:id"`
	Name       string
	Families   string
	Generation int64
	CreatedAt  time.Time
	UpdatedAt  time.Time
	RevokedAt  *time.Time
}

// PackageHostToken is one minted package host token: only its SHA-256 and
// the generation it was minted at.
type PackageHostToken struct {
	TokenHash   string `gorm:"primaryKey"`
	HostID      string
	Generation  int64
	OperationID string
	CreatedAt   time.Time
}
