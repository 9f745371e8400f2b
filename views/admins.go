package views

import (
	"net/url"
	"time"
)

// AdminRow is one administrator in the list.
type AdminRow struct {
	Username          string
	CreatedAt         time.Time
	DisabledAt        *time.Time
	PasswordChangedAt *time.Time
	LiveSessions      int64
	// Self: the signed-in administrator, who cannot disable themselves.
	Self bool
}

// ActionHref is the row's form action for one of disable, enable and
// sign-out.
func (a AdminRow) ActionHref(action string) string {
	return "/console/admins/" + url.PathEscape(a.Username) + "/" + action
}

// AdminsView is the administrators page, with the add form.
type AdminsView struct {
	Admins []AdminRow
	// Username is the add form's username, shown again after a refusal
	// (never the password).
	Username string
	// FieldErrors maps an add-form field (username, password) to what is
	// wrong with it.
	FieldErrors    map[string]string
	MinPasswordLen int
}

// AccountView is the signed-in administrator's own page: the password form
// and their other sessions.
type AccountView struct {
	Username          string
	CreatedAt         time.Time
	PasswordChangedAt *time.Time
	// OtherSessions is how many console sessions of theirs are open besides
	// this one.
	OtherSessions int64
	// FieldErrors maps a password-form field (current_password,
	// new_password, confirm_password) to what is wrong with it.
	FieldErrors    map[string]string
	MinPasswordLen int
}
