package views

import (
	"net/url"
	"strings"
	"time"
)

// PackageHostRow is one package host in the list (never a token).
type PackageHostRow struct {
	ID         string
	Name       string
	Families   []string
	Generation int64
	CreatedAt  time.Time
	RevokedAt  *time.Time
	// TokenRequestID is the request id of this row's "new token" form, so
	// a resubmitted form replays its operation instead of minting again.
	TokenRequestID string
}

// FamilyList is the host's families for display.
func (p PackageHostRow) FamilyList() string { return strings.Join(p.Families, ", ") }

// RevokeHref is the host's revoke action.
func (p PackageHostRow) RevokeHref() string {
	return "/console/package-hosts/" + url.PathEscape(p.ID) + "/revoke"
}

// TokenHref is the host's new-token action.
func (p PackageHostRow) TokenHref() string {
	return "/console/package-hosts/" + url.PathEscape(p.ID) + "/tokens"
}

// PackageHostsView is the package hosts page.
type PackageHostsView struct {
	Hosts []PackageHostRow
	// Families are the grantable families, the create form's checkboxes.
	Families []string
	// RequestID is the create form's request id (see TokenRequestID).
	RequestID string
	// Name, Checked and the errors echo a refused create form.
	Name          string
	Checked       map[string]bool
	NameError     string
	FamiliesError string
	FormError     string
	Paged         bool
	OlderBefore   string
}

// OlderHref links the next older page.
func (v PackageHostsView) OlderHref() string {
	return "/console/package-hosts?before=" + url.QueryEscape(v.OlderBefore)
}

// HostIssuedView shows a package host's new token, once.
type HostIssuedView struct {
	// Created: a new host (else a new token for an existing one).
	Created     bool
	ID          string
	Name        string
	Families    []string
	Generation  int64
	Token       string
	OperationID string
}

// FamilyList is the host's families for display.
func (v HostIssuedView) FamilyList() string { return strings.Join(v.Families, ", ") }

// RevokeConfirmView asks before revoking a host.
type RevokeConfirmView struct {
	Host      PackageHostRow
	RequestID string
}
