package admin

import (
	"bytes"
	"encoding/base64"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
)

// page is what the HTML template shows: an index, an identifier's state,
// or an error.
type page struct {
	Title   string
	Index   *Index
	State   *IDState
	Error   string
	Minutes int
	Names   []string // for the look-up form
	JSON    string   // the link to the page's JSON
}

// urlValues returns the query of an identifier's state: by id, or by
// digest if it has no id.
func urlValues(limit, id, digest string) string {
	if id == "" {
		return url.Values{"limit": {limit}, "digest": {digest}}.Encode()
	}
	return url.Values{"limit": {limit}, "id": {id}}.Encode()
}

// b64 is how the page's forms carry identifiers (id64, target64): form
// encoding turns a lone CR or LF of a field into CRLF, but leaves these
// bytes as they are.
func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// html/template escapes every value for where it stands: identifiers are
// the clients' input.
var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{"inc": func(i int) int { return i + 1 }, "b64": b64, "seconds": seconds}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td.id { font-family: ui-monospace, monospace; max-width: 40em; overflow-wrap: anywhere; }
.error { color: #a00; font-weight: bold; }
.muted { color: #777; }
form.inline { display: inline; margin: 0; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p><a href="./">Top denied</a> · <a href="{{.JSON}}">JSON</a></p>
{{with .Error}}<p class="error" id="error">{{.}}</p>{{end}}
<form method="get" action="id">
<label>Limit <select name="limit">{{range .Names}}<option>{{.}}</option>{{end}}</select></label>
<label>Identifier <input name="id" size="40" required></label>
<button type="submit">Look up</button>
</form>
{{with .Index}}
<p>Identifiers denied most in the last {{$.Minutes}} minutes, in this process. Counts are upper bounds, over by at most ±.</p>
{{range .Limits}}
<h2 id="limit-{{.Name}}">Limit {{.Name}}</h2>
<p>{{.Denied}} denials in the window.</p>
{{if .Top}}
<table class="top" data-limit="{{.Name}}">
<tr><th>#</th><th>Identifier</th><th>Denials</th><th>±</th><th></th></tr>
{{$limit := .Name}}{{range $i, $e := .Top}}<tr>
<td class="n">{{inc $i}}</td>
{{if $e.Digest}}<td class="id"><a href="id?limit={{$limit}}&amp;digest={{$e.Digest}}">{{$e.ID}}…</a> <span class="muted">({{len $e.ID}} bytes shown; digest {{$e.Digest}})</span></td>{{else}}<td class="id"><a href="id?limit={{$limit}}&amp;id={{$e.ID}}">{{$e.ID}}</a></td>{{end}}
<td class="n">{{$e.Count}}</td><td class="n">{{$e.Err}}</td>
<td><form class="inline" method="post" action="reset"><input type="hidden" name="limit" value="{{$limit}}">{{if $e.Digest}}<input type="hidden" name="digest" value="{{$e.Digest}}">{{else}}<input type="hidden" name="id64" value="{{b64 $e.ID}}">{{end}}<button type="submit">Reset</button></form></td>
</tr>{{end}}
</table>
{{else}}<p class="muted">No denials.</p>{{end}}
{{end}}
<p id="settled">Settled since start: {{.Settled.Debited}} units debited, {{.Settled.Credited}} credited (refunds included).</p>
<h2 id="overrides">Quota overrides</h2>
{{if .Overrides}}<table class="overrides">
<tr><th>Limit</th><th>Plan</th><th>Quota</th><th>Declared</th><th>Expires</th><th></th></tr>
{{range .Overrides}}<tr>
<td>{{.Limit}}</td><td>{{if .Plan}}{{.Plan}}{{else}}<span class="muted">default</span>{{end}}</td><td class="n">{{.Quota}}</td><td class="n declared">{{range $i, $q := .Declared}}{{if $i}}, {{end}}{{if lt $q 0}}unlimited{{else}}{{$q}}{{end}}{{else}}<span class="muted">none live</span>{{end}}</td>
<td>{{with .Expires}}{{.UTC.Format "2006-01-02 15:04:05 MST"}}{{else}}<span class="muted">until cleared</span>{{end}}</td>
<td><form class="inline" method="post" action="clear"><input type="hidden" name="limit" value="{{.Limit}}"><input type="hidden" name="plan" value="{{.Plan}}"><button type="submit">Clear</button></form></td>
</tr>{{end}}
</table>{{else}}<p class="muted">None: the declared quotas apply.</p>{{end}}
<h2 id="blocks">Blocks</h2>
{{if .Blocks}}<table class="blocks">
<tr><th>Target</th><th>Expires</th><th></th></tr>
{{range .Blocks}}<tr>
<td class="id">{{.Target}}</td><td>{{.Expires.UTC.Format "2006-01-02 15:04:05 MST"}}</td>
<td><form class="inline" method="post" action="unblock"><input type="hidden" name="target64" value="{{b64 .Target}}"><button type="submit">Unblock</button></form></td>
</tr>{{end}}
</table>{{else}}<p class="muted">None.</p>{{end}}
{{end}}
{{with .State}}
<table class="state">
<tr><th>Limit</th><td>{{.Limit}}</td></tr>
<tr><th>Identifier</th><td class="id" id="id">{{if .ID}}{{.ID}}{{else}}<span class="muted">known by its digest only</span>{{end}}</td></tr>
{{with .Digest}}<tr><th>Digest</th><td class="id" id="digest">{{.}}</td></tr>{{end}}
<tr><th>Plan</th><td>{{if .Plan}}{{.Plan}}{{else}}<span class="muted">default</span>{{end}}</td></tr>
{{if .InFlight}}<tr><th>In flight</th><td id="holders">{{.Holders}} of {{.Quota}} requests at once (slots leased for {{.WindowSeconds}} s)</td></tr>
<tr><th>Remaining</th><td id="remaining">{{.Remaining}}</td></tr>{{else}}<tr><th>Quota</th><td>{{.Quota}} per {{seconds .WindowSeconds}} s</td></tr>
<tr><th>Remaining</th><td id="remaining">{{.Remaining}}</td></tr>
<tr><th>Reset</th><td>{{.Reset.UTC.Format "2006-01-02 15:04:05.000 MST"}}</td></tr>{{end}}
<tr><th>Denied now</th><td>{{if .Denied}}yes{{else}}no{{end}}</td></tr>
<tr><th>Denials recently</th><td>{{.DeniedRecently}} in the last {{$.Minutes}} minutes, in this process</td></tr>
<tr><th>Override</th><td id="override">{{with .Override}}quota {{.Quota}}{{with .Declared}} (declared {{range $i, $q := .}}{{if $i}}, {{end}}{{if lt $q 0}}unlimited{{else}}{{$q}}{{end}}{{end}}){{end}}{{with .Expires}} until {{.UTC.Format "2006-01-02 15:04:05 MST"}}{{end}}{{else}}<span class="muted">none</span>{{end}}</td></tr>
<tr><th>Block</th><td id="block">{{with .Block}}blocked ({{.Target}}) until {{.Expires.UTC.Format "2006-01-02 15:04:05 MST"}}
<form class="inline" method="post" action="unblock"><input type="hidden" name="target64" value="{{b64 .Target}}"><button type="submit">Unblock</button></form>{{else}}<span class="muted">none</span>{{end}}</td></tr>
</table>
<form method="post" action="reset"><input type="hidden" name="limit" value="{{.Limit}}">{{if .ID}}<input type="hidden" name="id64" value="{{b64 .ID}}">{{else}}<input type="hidden" name="digest" value="{{.Digest}}">{{end}}<button type="submit">Reset this identifier in {{.Limit}}</button></form>
{{end}}
</body>
</html>
`))

// render writes p as HTML.
func render(w http.ResponseWriter, status int, p page) {
	p.JSON = "?format=json"
	if p.State != nil {
		p.JSON = "id?format=json&" + urlValues(p.State.Limit, p.State.ID, p.State.Digest)
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, p); err != nil {
		http.Error(w, "admin: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// seconds writes a window in seconds without an exponent: a month's
// calendar period (a Calendar quota's Window) is "2678400", not
// "2.6784e+06".
func seconds(s float64) string { return strconv.FormatFloat(s, 'f', -1, 64) }
