package sidecarconfig

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ParseTrustedProxy parses one entry of Config.TrustedProxies, a CIDR, into
// the prefix the sidecar matches addresses with (see TrustedProxy). The
// manager's flag, the document's validation and the sidecar all parse
// trusted proxies through it, so they cannot disagree.
func ParseTrustedProxy(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return TrustedProxy(p), nil
}

// TrustedProxy returns p masked, and an IPv4-mapped IPv6 prefix
// (::ffff:10.0.0.0/104) as the IPv4 prefix it covers (10.0.0.0/8): the
// sidecar unmaps every peer and forwarded address before matching, so a
// mapped prefix left in IPv6 form would never match. A mapped prefix
// shorter than /96 covers every IPv4 address (0.0.0.0/0).
func TrustedProxy(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
	}
	return p.Masked()
}

// ParseTrustedProxies parses the manager's --trusted-proxies list: CIDRs
// (as ParseTrustedProxy), or single addresses taken as /32 or /128; blank
// entries are skipped. The result is as TrustedProxies returns it.
func ParseTrustedProxies(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := ParseTrustedProxy(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("trusted proxy %q is neither a CIDR nor an IP address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p)
	}
	return TrustedProxies(out), nil
}

// TrustedProxies returns the valid prefixes of in, each as TrustedProxy
// returns it, sorted (by address, then length) and without duplicates: the
// canonical list a rendered document carries.
func TrustedProxies(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if p.IsValid() {
			out = append(out, TrustedProxy(p))
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
