// Package diagnose owns the diagnostics the control plane runs itself
// (DECISIONS.md §46): probing an HTTP(S) endpoint (diagnose.endpoint) from
// the server, only to destinations the operator allowed.
//
// The allowlist (NODEWARD_DIAGNOSE_ALLOW) holds CIDRs and host names,
// comma-separated; empty refuses everything. A destination is allowed
// when its host is a listed name, or an IP address inside a listed CIDR,
// or a name whose every resolved address is inside a listed CIDR. The
// addresses a probe connects to are checked again when it connects, and
// the probe connects to exactly the address it checked (never resolving
// twice), so a name that rebinds between submit and probe gains nothing:
// an address inside a listed CIDR is allowed; any other must be a public
// unicast address — loopback, link-local (cloud metadata), private,
// unique-local, multicast and unspecified addresses are refused unless a
// listed CIDR covers them.
//
// A probe answers evidence: the status, latency and, for HTTPS, the
// certificate's expiry; an endpoint that cannot be reached is evidence too.
// Redirects are never followed (their Location is reported). A bearer
// credential is sent only after the TLS handshake verified the server (or
// over plain HTTP when the operator asked for an http URL), and appears in
// no evidence, error or log.
package diagnose

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeward/nodeward/errcode"
)

// MaxProbeTime bounds one probe from its first lookup to the end of the
// response headers (and 64 KiB of body, read and discarded).
const MaxProbeTime = 10 * time.Second

// Allowlist is the destinations an operator allowed.
type Allowlist struct {
	nets  []netip.Prefix
	names map[string]bool
}

// ParseAllowlist reads "10.0.0.0/8, 192.0.2.7, api.example.com": CIDRs,
// single addresses (a /32 or /128) and host names. Empty allows nothing.
func ParseAllowlist(s string) (Allowlist, error) {
	a := Allowlist{names: map[string]bool{}}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if p, err := netip.ParsePrefix(item); err == nil {
			a.nets = append(a.nets, p.Masked())
			continue
		}
		if ip, err := netip.ParseAddr(item); err == nil {
			a.nets = append(a.nets, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
			continue
		}
		name := strings.ToLower(strings.TrimSuffix(item, "."))
		if !validName(name) {
			return Allowlist{}, fmt.Errorf("diagnose allowlist: %q is neither a CIDR, an IP address nor a host name", item)
		}
		a.names[name] = true
	}
	return a, nil
}

// Empty reports whether nothing is allowed.
func (a Allowlist) Empty() bool { return len(a.nets) == 0 && len(a.names) == 0 }

func (a Allowlist) inNets(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range a.nets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// addrAllowed reports whether a probe may connect to ip: inside a listed
// CIDR, or (for a listed name) a public unicast address.
func (a Allowlist) addrAllowed(ip netip.Addr, byName bool) bool {
	ip = ip.Unmap()
	if a.inNets(ip) {
		return true
	}
	return byName && isPublic(ip)
}

// notPublic are the special-purpose ranges (IANA's registries) that
// IsGlobalUnicast and IsPrivate let through but no public service is
// reached at: shared carrier-grade NAT space (which holds a cloud's
// metadata address, 100.100.100.200), benchmarking, documentation,
// reserved space, and the IPv6 ranges that embed an IPv4 address (NAT64,
// 6to4, Teredo, IPv4-compatible), through which a name could reach an
// address the IPv4 checks refuse.
var notPublic = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
		"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
		"::/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "2002::/16",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

func isPublic(ip netip.Addr) bool {
	if !ip.IsGlobalUnicast() || ip.IsPrivate() {
		return false
	}
	for _, p := range notPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// ErrNotAllowed is the refusal of a destination the allowlist does not
// allow: 403 destination_not_allowed.
var ErrNotAllowed = errcode.New(errcode.DestinationNotAllowed, "this destination is not allowed by the server's diagnose allowlist (NODEWARD_DIAGNOSE_ALLOW)")

// Resolver looks host names up (net.DefaultResolver in production).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Prober probes endpoints for diagnose.endpoint.
type Prober struct {
	Allow    Allowlist
	Resolver Resolver
	// RootCAs verifies servers' certificates; nil is the system's roots.
	RootCAs *x509.CertPool
	// Now is the clock for certificate expiry (default time.Now).
	Now func() time.Time
}

func (p *Prober) resolver() Resolver {
	if p.Resolver == nil {
		return net.DefaultResolver
	}
	return p.Resolver
}

func (p *Prober) now() time.Time {
	if p.Now == nil {
		return time.Now()
	}
	return p.Now()
}

// ParseURL checks a probe's URL: absolute http or https, a host, no user
// information (credentials go in the sealed field, never the URL).
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil, len(raw) > 2048:
		return nil, errors.New("an absolute http(s) URL of at most 2048 bytes")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("an http or https URL")
	case u.Hostname() == "":
		return nil, errors.New("a URL with a host")
	case u.User != nil:
		return nil, errors.New("no user information in the URL (seal a credential instead)")
	case u.Fragment != "":
		return nil, errors.New("no fragment")
	}
	return u, nil
}

// Check refuses (ErrNotAllowed) a URL whose host the allowlist does not
// allow, resolving a name not listed by name to see whether its addresses
// are all inside listed CIDRs. It is the submit-time check; Probe checks
// the addresses again when it connects.
func (p *Prober) Check(ctx context.Context, u *url.URL) error {
	if p.Allow.Empty() {
		return ErrNotAllowed
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		if p.Allow.inNets(ip) {
			return nil
		}
		return ErrNotAllowed
	}
	if p.Allow.names[host] {
		return nil
	}
	if len(p.Allow.nets) == 0 {
		return ErrNotAllowed
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := p.resolver().LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return ErrNotAllowed
	}
	for _, ip := range ips {
		if !p.Allow.inNets(ip) {
			return ErrNotAllowed
		}
	}
	return nil
}

// Evidence is what a probe found.
type Evidence struct {
	Action string    `json:"action"`
	URL    string    `json:"url"`
	RanAt  time.Time `json:"ran_at"`
	// Reached: an HTTP response arrived (whatever its status).
	Reached bool `json:"reached"`
	Status  int  `json:"status,omitempty"`
	// LatencyMs is the time to the response headers (or to the failure).
	LatencyMs float64 `json:"latency_ms"`
	// Addresses are those the host resolved to; ConnectedTo the one used.
	Addresses   []string     `json:"addresses,omitempty"`
	ConnectedTo string       `json:"connected_to,omitempty"`
	TLS         *TLSEvidence `json:"tls,omitempty"`
	Redirect    *Redirect    `json:"redirect,omitempty"`
	// CredentialSent says whether the sealed bearer credential was sent
	// (never what it was).
	CredentialSent bool   `json:"credential_sent"`
	Error          string `json:"error,omitempty"`
}

// TLSEvidence is the server's leaf certificate, as presented.
type TLSEvidence struct {
	Version          string    `json:"version,omitempty"`
	Subject          string    `json:"subject"`
	Issuer           string    `json:"issuer"`
	NotAfter         time.Time `json:"not_after"`
	ExpiresInSeconds int64     `json:"expires_in_seconds"`
	Verified         bool      `json:"verified"`
	VerifyError      string    `json:"verify_error,omitempty"`
}

// Redirect is a redirect the probe answered and did not follow.
type Redirect struct {
	Location string `json:"location"`
	// SameHost: the Location names the probed host (still not followed).
	SameHost bool `json:"same_host"`
	Followed bool `json:"followed"`
}

// Probe requests u (GET) once, with "Authorization: Bearer credential"
// when credential is not empty, within MaxProbeTime. It answers
// ErrNotAllowed when no address the host resolves to may be connected
// to; anything else that goes wrong is evidence.
func (p *Prober) Probe(ctx context.Context, u *url.URL, credential string) (Evidence, error) {
	ctx, cancel := context.WithTimeout(ctx, MaxProbeTime)
	defer cancel()
	ev := Evidence{Action: "endpoint", URL: u.Redacted(), RanAt: p.now().UTC()}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	start := time.Now()
	elapsed := func() float64 { return float64(time.Since(start).Microseconds()) / 1000 }

	var ips []netip.Addr
	byName := false
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		byName = p.Allow.names[host]
		found, err := p.resolver().LookupNetIP(ctx, "ip", host)
		if err != nil {
			ev.LatencyMs, ev.Error = elapsed(), "resolve: "+clip(err.Error())
			return ev, nil
		}
		ips = found
	}
	var allowed []netip.Addr
	for _, ip := range ips {
		ev.Addresses = append(ev.Addresses, ip.String())
		if p.Allow.addrAllowed(ip, byName) {
			allowed = append(allowed, ip)
		}
	}
	if len(allowed) == 0 {
		return ev, ErrNotAllowed
	}

	// Written by the transport's goroutines, read once Do returned.
	var mu sync.Mutex
	var tlsEv *TLSEvidence
	var dialed string
	var wrote atomic.Bool
	tlsConf := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12,
		// Verified here, after the leaf is recorded: an expired or untrusted
		// certificate is reported, and the handshake still fails, so no
		// request (and no credential) reaches an unverified server.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			leaf := cs.PeerCertificates[0]
			ev := &TLSEvidence{Version: tls.VersionName(cs.Version), Subject: leaf.Subject.String(),
				Issuer: leaf.Issuer.String(), NotAfter: leaf.NotAfter.UTC(),
				ExpiresInSeconds: int64(leaf.NotAfter.Sub(p.now()).Seconds())}
			mu.Lock()
			defer mu.Unlock()
			tlsEv = ev
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: p.RootCAs, Intermediates: inter, CurrentTime: p.now()})
			if err != nil {
				ev.VerifyError = clip(err.Error())
				return err
			}
			ev.Verified = true
			return nil
		}}
	dialer := &net.Dialer{Timeout: MaxProbeTime}
	tr := &http.Transport{
		Proxy:           nil, // the checked address, never a proxy's
		TLSClientConfig: tlsConf,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var last error
			for _, ip := range allowed {
				c, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(ip.String(), port))
				if err == nil {
					mu.Lock()
					dialed = ip.String()
					mu.Unlock()
					return c, nil
				}
				last = err
			}
			return nil, last
		},
		DisableKeepAlives:      true,
		ResponseHeaderTimeout:  MaxProbeTime,
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return ev, err
	}
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }}))
	req.Header.Set("User-Agent", "nodeward-diagnose/1")
	if credential != "" {
		req.Header.Set("Authorization", "Bearer "+credential)
	}
	resp, err := client.Do(req)
	mu.Lock()
	ev.LatencyMs, ev.TLS, ev.ConnectedTo = elapsed(), tlsEv, dialed
	mu.Unlock()
	if err != nil {
		// The transport's text names the URL and the address, never a
		// header; the credential is scrubbed again by the ledger anyway.
		msg := err.Error()
		if credential != "" {
			msg = strings.ReplaceAll(msg, credential, "[sealed]")
		}
		ev.Error, ev.CredentialSent = clip(msg), credential != "" && wrote.Load()
		return ev, nil
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	ev.Reached, ev.Status = true, resp.StatusCode
	ev.CredentialSent = credential != ""
	if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode >= 300 && resp.StatusCode < 400 {
		r := &Redirect{Location: clip(loc)}
		if to, err := u.Parse(loc); err == nil {
			r.SameHost = strings.EqualFold(to.Host, u.Host) && to.Scheme == u.Scheme
		}
		ev.Redirect = r
	}
	return ev, nil
}

func clip(s string) string {
	if len(s) > 512 {
		return strings.ToValidUTF8(s[:512], "") + "…"
	}
	return s
}
