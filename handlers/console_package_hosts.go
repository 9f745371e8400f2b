package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/nodeward/nodeward/auth"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/views"
)

// consoleHostsPageSize is how many package hosts one console page shows.
const consoleHostsPageSize = 50

func hostRow(p auth.PackageHost) views.PackageHostRow {
	return views.PackageHostRow{ID: p.ID, Name: p.Name, Families: p.Families, Generation: p.Generation,
		CreatedAt: p.CreatedAt, RevokedAt: p.RevokedAt, TokenRequestID: newRequestID()}
}

// packageHostsView reads one page of hosts into a fresh create form.
func (h *handler) packageHostsView(r *http.Request) (views.PackageHostsView, error) {
	v := views.PackageHostsView{Families: auth.GrantableFamilies, RequestID: newRequestID()}
	q := queryOf(r)
	before, err := q.cursor("before", "a cursor from the Older link")
	if err != nil {
		return v, err
	}
	v.Paged = before > 0
	rows, err := h.Auth.ListPackageHosts(r.Context(), before, consoleHostsPageSize)
	if err != nil {
		return v, err
	}
	for _, p := range rows {
		v.Hosts = append(v.Hosts, hostRow(p))
	}
	if len(rows) == consoleHostsPageSize {
		v.OlderBefore = strconv.FormatInt(rows[len(rows)-1].Cursor, 10)
	}
	return v, nil
}

func (h *handler) consolePackageHosts(w http.ResponseWriter, r *http.Request) {
	v, err := h.packageHostsView(r)
	if errcode.Of(err) == errcode.InvalidParameter {
		h.consoleError(w, r, consoleFrom(r.Context()), http.StatusBadRequest, "Bad page link", "The package hosts page cursor is not valid.")
		return
	}
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	s := h.shell(r, views.NavHosts)
	// After a revoke or a form sent twice, name the host (looked up, never
	// echoed).
	if id := r.URL.Query().Get("revoked"); id != "" {
		if p, err := h.Auth.PackageHost(r.Context(), id); err == nil && p.RevokedAt != nil {
			s.Flash = views.Flash{Kind: views.FlashOK, Message: "Revoked the package host “" + p.Name + "”. Its token no longer works."}
		}
	}
	if id := r.URL.Query().Get("replayed"); id != "" {
		if p, err := h.Auth.PackageHost(r.Context(), id); err == nil {
			s.Flash = views.Flash{Kind: views.FlashInfo, Message: "That form was sent already: the token for “" + p.Name +
				"” was shown then and is not shown again. If it was lost, issue a new token."}
		}
	}
	h.render(w, r, http.StatusOK, views.PackageHostsPage(s, v))
}

func (h *handler) consoleCreatePackageHost(w http.ResponseWriter, r *http.Request) {
	name := r.PostForm.Get("name")
	families := r.PostForm["families"]
	// The API's own check first, then the same operation the API submits.
	_, err := auth.ValidatePackageHost(name, families, "")
	var op ledger.Operation
	created := false
	if err == nil {
		op, created, err = h.runCredential(r, formRequestID(r), ledger.KindCredentialIssue, nil,
			ledger.IssueOperation{Name: name, Families: families})
	}
	if err != nil && !errors.Is(err, errCredentialRunning) {
		h.refuseHostForm(w, r, name, families, err)
		return
	}
	h.showIssued(w, r, op, created, err, true)
}

// showIssued shows the token a credential.issue minted, once: a form sent
// again (its request id replays the operation) is told the token was shown
// already, and an operation still running is shown on its own page.
func (h *handler) showIssued(w http.ResponseWriter, r *http.Request, op ledger.Operation, created bool, err error, newHost bool) {
	if errors.Is(err, errCredentialRunning) {
		http.Redirect(w, r, views.OperationHref(op.ID), http.StatusSeeOther)
		return
	}
	if !created {
		res, err := ledger.ResultPackageHost(op)
		if err != nil {
			h.consoleInternal(w, r, err)
			return
		}
		http.Redirect(w, r, "/console/package-hosts?replayed="+url.QueryEscape(res.PackageHostID), http.StatusSeeOther)
		return
	}
	host, tok, err := h.issuedHost(r, op)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, views.HostIssuedPage(h.shell(r, views.NavHosts), views.HostIssuedView{
		Created: newHost, ID: host.ID, Name: host.Name, Families: host.Families, Generation: host.Generation,
		Token: tok, OperationID: op.ID,
	}))
}

// refuseHostForm shows the page again with the create form's errors: the
// API's messages, by field.
func (h *handler) refuseHostForm(w http.ResponseWriter, r *http.Request, name string, families []string, err error) {
	var e *errcode.Error
	if !errors.As(err, &e) || statusFor(r, err) >= 500 {
		h.consoleInternal(w, r, err)
		return
	}
	v, lerr := h.packageHostsView(r)
	if lerr != nil {
		h.consoleInternal(w, r, lerr)
		return
	}
	v.Name, v.Checked = name, map[string]bool{}
	for _, f := range families {
		v.Checked[f] = true
	}
	for _, f := range e.Fields {
		switch strings.TrimPrefix(f.Field, "operation/") {
		case "name":
			v.NameError = f.Message
		case "families":
			v.FamiliesError = f.Message
		}
	}
	if errors.Is(err, auth.ErrPackageHostNameTaken) {
		v.NameError = e.Message
	}
	if v.NameError == "" && v.FamiliesError == "" {
		v.FormError = e.Message
	}
	h.render(w, r, statusFor(r, err), views.PackageHostsPage(h.shell(r, views.NavHosts), v))
}

// hostTarget is the target of a change to an existing host.
func hostTarget(r *http.Request) []ledger.Target {
	return []ledger.Target{{Kind: ledger.TargetPackageHost, ID: chi.URLParam(r, "id")}}
}

// hostActionFailed shows why a change to an existing host was refused.
func (h *handler) hostActionFailed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, auth.ErrPackageHostNotFound) {
		h.consoleError(w, r, consoleFrom(r.Context()), http.StatusNotFound, "No such package host", "That package host does not exist.")
		return
	}
	h.consoleInternal(w, r, err)
}

func (h *handler) consoleIssuePackageHostToken(w http.ResponseWriter, r *http.Request) {
	op, created, err := h.runCredential(r, formRequestID(r), ledger.KindCredentialIssue, hostTarget(r), ledger.IssueOperation{})
	if err != nil && !errors.Is(err, errCredentialRunning) {
		h.hostActionFailed(w, r, err)
		return
	}
	h.showIssued(w, r, op, created, err, false)
}

// consoleRevokePackageHost asks for confirmation first (a page with a
// form that confirms), then revokes.
func (h *handler) consoleRevokePackageHost(w http.ResponseWriter, r *http.Request) {
	if r.PostForm.Get("confirm") != "yes" {
		p, err := h.Auth.PackageHost(r.Context(), chi.URLParam(r, "id"))
		if err != nil {
			h.hostActionFailed(w, r, err)
			return
		}
		h.render(w, r, http.StatusOK, views.RevokeHostPage(h.shell(r, views.NavHosts),
			views.RevokeConfirmView{Host: hostRow(p), RequestID: newRequestID()}))
		return
	}
	op, _, err := h.runCredential(r, formRequestID(r), ledger.KindCredentialRevoke, hostTarget(r), ledger.RevokeOperation{})
	if errors.Is(err, errCredentialRunning) {
		http.Redirect(w, r, views.OperationHref(op.ID), http.StatusSeeOther)
		return
	}
	if err != nil {
		h.hostActionFailed(w, r, err)
		return
	}
	res, err := ledger.ResultPackageHost(op)
	if err != nil {
		h.consoleInternal(w, r, err)
		return
	}
	http.Redirect(w, r, "/console/package-hosts?revoked="+url.QueryEscape(res.PackageHostID), http.StatusSeeOther)
}
