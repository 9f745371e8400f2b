package handlers

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzLocalNext: whatever the sign-in form's next holds, the redirect after
// sign-in stays on this server's console.
func FuzzLocalNext(f *testing.F) {
	for _, s := range []string{
		"/console/", "/console/tokens?x=1", "//evil.example", "/\\evil", "https://evil.example/console/",
		"/console/../api", "/console//evil.example", "javascript:alert(1)", "/console/%2F%2Fevil", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, next string) {
		got := localNext(next)
		if got == "" {
			return
		}
		if got != next {
			t.Fatalf("localNext(%q) = %q: it may only accept or refuse", next, got)
		}
		u, err := url.Parse(got)
		if err != nil || u.Scheme != "" || u.Host != "" || !strings.HasPrefix(got, "/console") ||
			strings.HasPrefix(got, "//") || strings.ContainsAny(got, "\\\r\n\t") {
			t.Fatalf("localNext accepted %q", got)
		}
		// A browser resolving it against this server stays on this server.
		base, _ := url.Parse("https://cp.example/console/login")
		if r := base.ResolveReference(u); r.Host != "cp.example" {
			t.Fatalf("localNext accepted %q, which resolves to %s", got, r)
		}
	})
}
