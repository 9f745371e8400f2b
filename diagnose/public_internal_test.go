package diagnose

import (
	"net/netip"
	"testing"
)

// TestIsPublic: the ranges refused are exactly the special-purpose ones;
// addresses just outside them are public.
func TestIsPublic(t *testing.T) {
	for addr, want := range map[string]bool{
		"1.1.1.1": true, "8.8.8.8": true, "2606:4700:4700::1111": true, "2a00:1450::1": true,
		"100.63.255.255": true, "100.128.0.0": true, "198.20.0.1": true, "223.255.255.255": true,
		"100.64.0.0": false, "100.127.255.255": false, "198.19.255.255": false, "255.255.255.254": false,
		"10.1.1.1": false, "172.16.0.1": false, "192.168.1.1": false, "127.0.0.1": false, "169.254.169.254": false,
		"fd12::1": false, "fe80::1": false, "::1": false, "64:ff9b::808:808": false, "2002:808:808::1": false,
		"ff02::1": false, "224.0.0.1": false,
	} {
		if got := isPublic(netip.MustParseAddr(addr)); got != want {
			t.Errorf("isPublic(%s) = %v, want %v", addr, got, want)
		}
	}
}
