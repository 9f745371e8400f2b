package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Behind a balancer or reverse proxy every request's TCP peer is the
// proxy: the sign-in limit would be shared by everyone, and the audit and
// the access log would name the proxy. Operators name their proxies
// (NODEWARD_TRUSTED_PROXIES); a request whose peer is one of them is taken
// to come from the right-most X-Forwarded-For address that is not. Entries
// further left were written by the client and may be forged, so they are
// never read. With no proxies named the header is ignored entirely.

// ParseTrustedProxies reads a comma-separated list of CIDRs and single
// addresses ("10.0.0.0/8, 192.0.2.7"). Empty is none.
func ParseTrustedProxies(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if p, err := netip.ParsePrefix(item); err == nil {
			if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
				// Peers are compared unmapped: write ::ffff:a.b.c.d/n as IPv4.
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("trusted proxies (NODEWARD_TRUSTED_PROXIES, --trusted-proxies): %q is neither a CIDR nor an IP address", item)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// errNoClient: the forwarded chain held something that is not an address.
var errNoClient = errors.New("forwarded chain unreadable")

// clientAddr answers the request's client as host:port: remote itself
// unless its host is a trusted proxy, in which case the right-most
// forwarded address that is not one (port 0, which the chain does not
// carry). An unreadable chain, or one of proxies only, leaves remote.
// fromChain reports that the client was read from the chain.
func clientAddr(remote string, forwarded []string, trusted []netip.Prefix) (client string, fromChain bool) {
	peer, err := netip.ParseAddrPort(remote)
	if err != nil || !isTrusted(peer.Addr(), trusted) {
		return remote, false
	}
	a, err := rightmostUntrusted(forwarded, trusted)
	if err != nil {
		return remote, false
	}
	return netip.AddrPortFrom(a, 0).String(), true
}

func rightmostUntrusted(forwarded []string, trusted []netip.Prefix) (netip.Addr, error) {
	for i := len(forwarded) - 1; i >= 0; i-- {
		hops := strings.Split(forwarded[i], ",")
		for j := len(hops) - 1; j >= 0; j-- {
			a, err := parseHop(strings.TrimSpace(hops[j]))
			if err != nil {
				return netip.Addr{}, err
			}
			if !isTrusted(a, trusted) {
				return a, nil
			}
		}
	}
	return netip.Addr{}, errNoClient
}

// parseHop reads one X-Forwarded-For entry: an address, or (as some
// proxies write it) an address with a port.
func parseHop(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), nil
	}
	return netip.Addr{}, errNoClient
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// fromProxy sets r.RemoteAddr to the client behind trusted proxies (in
// place, before anything reads it: no copy of the request per call). It
// answers the proxy it replaced, the TCP peer, when it did, else "".
func (h *handler) fromProxy(r *http.Request) (proxy string) {
	if len(h.TrustedProxies) == 0 {
		return ""
	}
	client, fromChain := clientAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), h.TrustedProxies)
	if !fromChain {
		return ""
	}
	proxy, r.RemoteAddr = r.RemoteAddr, client
	return proxy
}
