package ratelimit

import (
	"log/slog"
	"net/http"
)

// proxyWarning is the message of the warning proxyWatch logs.
const proxyWarning = "ratelimit: requests arrive through a proxy that is not trusted: every client behind it shares one limit, the proxy's address"

// proxyHeaders are the headers proxies and CDNs set to pass on the client
// address: a request that carries one came through a proxy, or from a
// client that wrote it. name is how the warning spells it; key is the
// canonical form the request's Header map holds.
var proxyHeaders = [...]struct{ name, key string }{
	{"X-Forwarded-For", "X-Forwarded-For"},
	{"Forwarded", "Forwarded"},
	{"X-Real-IP", "X-Real-Ip"},
	{"CF-Connecting-IP", "Cf-Connecting-Ip"},
	{"True-Client-IP", "True-Client-Ip"},
	{"Fastly-Client-IP", "Fastly-Client-Ip"},
}

// maxLoggedHeader bounds the part of a header value the warning logs (with
// logIdentifiers only), so that a hostile header cannot make a huge line.
const maxLoggedHeader = 256

// proxyWatch reports, once per Limiter, the warning that requests
// come through a proxy that ClientIP does not trust
// ([WarningUntrustedProxy]).
type proxyWatch struct{ warnOnce }

// watchesProxies reports whether a Limiter with cfg and limits looks for
// proxy headers: one of its limits or allow-lists counts by the peer
// address without trusting any proxy (and not by the address a router
// resolved, [clientip.FromRouter]). It does with or without a logger: the warning
// goes to slog's default logger without one.
func watchesProxies(cfg *config, limits []Limit) bool {
	watch := cfg.peerAllow
	for i := range limits {
		watch = watch || limits[i].Key.peer
	}
	return watch
}

// check reports the warning, through logger (slog's default if nil) and
// to the Warning hooks, if r carries a proxy header and the warning was not
// reported before; the header's value and the peer are logged only if
// logIDs. It does not allocate when r carries no proxy header.
func (p *proxyWatch) watch(r *http.Request, logger *slog.Logger, logIDs bool, onWarning []func(Warning)) {
	for _, h := range proxyHeaders {
		v := r.Header[h.key]
		if len(v) == 0 {
			continue
		}
		if p.done.Load() {
			return
		}
		attrs := []any{slog.String("header", h.name), slog.String("remedy", proxyRemedy(h.name))}
		if logIDs {
			value := v[0]
			if len(value) > maxLoggedHeader {
				value = value[:maxLoggedHeader] + "..."
			}
			attrs = append(attrs, slog.String("value", value), slog.String("peer", r.RemoteAddr))
		}
		p.report(logger, onWarning, WarningUntrustedProxy, proxyWarning, attrs...)
		return
	}
}

// proxyRemedy says how to trust the proxy that set header.
func proxyRemedy(header string) string {
	const notProxied = "; if no proxy stands in front of the app, a client sent " // + header + ...
	const ignore = " itself, and this warning can be ignored"
	switch header {
	case "CF-Connecting-IP":
		return "count by ClientIP(clientip.TrustCloudflare(ranges...)) with Cloudflare's ranges, published at https://www.cloudflare.com/ips/" +
			", and list any proxy between Cloudflare and the app with TrustProxies" + notProxied + header + ignore
	case "X-Forwarded-For":
		return "list the proxies' addresses with ClientIP(clientip.TrustProxies(cidrs...)), or use ClientIP(clientip.TrustPrivateNetworks()) if they are all in private networks" +
			", or ClientIP(clientip.FromRouter()) if the router resolves the client address (gin's SetTrustedProxies, echo's IPExtractor, chi's RealIP)" +
			notProxied + header + ignore
	}
	return "list the proxies' addresses with ClientIP(clientip.TrustProxies(cidrs...)) or ClientIP(clientip.TrustPrivateNetworks()), and add clientip.ProxyHeader(\"" + header +
		"\") if it is the header they set the client address in" + notProxied + header + ignore
}
