package auth

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// refusalWindow is how long repeated refused logins of one client fold
// into one audit entry: a guessing run costs one row per client per
// window, whatever the usernames it tries.
const refusalWindow = 15 * time.Minute

// maxActorLen bounds an audited actor (runes before escaping), so a
// submitted username cannot make an entry large.
const maxActorLen = 64

// auditRefusal records a refused login (or another password check, as
// action says) of username from host, folded into the client's entry for
// this window (the count says how many; the detail names the latest
// username tried). A failure to record is not the caller's failure: the
// attempt is refused either way.
func (s *Service) auditRefusal(ctx context.Context, username, action, outcome, host string) {
	now := s.now()
	actor := sanitizeActor(username)
	e := AuditEntry{At: now, Actor: actor, Action: action, Outcome: outcome, RemoteAddr: host,
		Detail: foldUsername("", actor), Count: 1}
	// In one transaction so that, on SQLite, concurrent refusals of one
	// client cannot both miss the entry and append two, and the usernames
	// folded in are not lost to a race.
	_ = s.store.Tx(ctx, func(tx Store) error {
		return tx.CoalesceAudit(ctx, e, now.Add(-refusalWindow), func(detail string) string {
			return foldUsername(detail, actor)
		})
	})
}

// maxTried is how many distinct usernames a coalesced refusal names; past
// it the list ends in "…" (the count still counts every refusal).
const maxTried = 8

// foldUsername is a refusal entry's detail once actor (sanitized) was
// tried: `last_username="ACTOR" tried="a","b"`, the distinct usernames in
// the order first tried. Every name is a quoted Go string, so no submitted
// text can end one early or pose as the list (the old detail is parsed
// name by name, never searched).
func foldUsername(detail, actor string) string {
	names, more := triedNames(detail)
	if !slices.Contains(names, actor) {
		if len(names) < maxTried {
			names = append(names, actor)
		} else {
			more = true
		}
	}
	var b strings.Builder
	b.WriteString("last_username=" + strconv.Quote(actor) + " tried=")
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(n))
	}
	if more {
		b.WriteString(",…")
	}
	return b.String()
}

// triedNames reads the names foldUsername wrote into detail, and whether
// the list was full; a detail in any other form (an older entry) reads as
// none.
func triedNames(detail string) (names []string, more bool) {
	rest, ok := strings.CutPrefix(detail, "last_username=")
	if !ok {
		return nil, false
	}
	last, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return nil, false
	}
	if rest, ok = strings.CutPrefix(rest[len(last):], " tried="); !ok {
		return nil, false
	}
	for {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return names, false
		}
		n, _ := strconv.Unquote(q)
		names = append(names, n)
		rest = rest[len(q):]
		switch {
		case rest == ",…":
			return names, true
		case strings.HasPrefix(rest, ","):
			rest = rest[1:]
		default:
			return names, false
		}
	}
}

// sanitizeActor makes a submitted name safe to store and show: at most
// maxActorLen runes, control and invalid bytes escaped (\n, \x1b, \u2028
// ...), a cut marked with "…".
func sanitizeActor(name string) string {
	var b strings.Builder
	n := 0
	for i, r := range name {
		if n == maxActorLen {
			if i < len(name) {
				b.WriteString("…")
			}
			break
		}
		n++
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(name[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, name[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || unicode.In(r, unicode.Zl, unicode.Zp, unicode.Cf):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
