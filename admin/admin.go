// Package admin serves, on an application's admin port, who its
// [ratelimit.Limiter]s deny: for each limit, the identifiers denied most
// in the last minutes, the state of one identifier in a limit, and a way
// to reset it. In the style of net/http/pprof, for people (one plain HTML
// page, no external assets) and for tools (the same as JSON).
//
//	adm := admin.New(admin.Options{})
//	limiter, err := ratelimit.New(rdb, limits, ratelimit.WithObserver(adm.Observer()))
//	adminMux.Handle("/debug/ratelimit/", adm) // never on the public port
//
// WithObserver is the one step: the Handler's [Handler.Observer] is told
// of every denial, and given the Limiter to read and reset identifiers
// with. One Handler may observe several Limiters.
//
// The Handler counts denials in this process only, in memory bounded in
// bytes whatever the number and the length of the identifiers (a
// heavy-hitters sketch: see [Options.Capacity]); the state of an
// identifier and a reset are read and made in Redis, for every replica.
//
// An identifier longer than [operator.MaxKeyID] bytes is not kept whole:
// the Redis keys hold its digest ([operator.IDDigest]) instead, and so
// does the sketch, with its first bytes to recognise it by. Such an entry
// is looked up and reset by its digest (digest=, in place of id=), as the
// page's links and forms do.
//
// Endpoints, relative to where the Handler is mounted (a path ending in
// "/"); each answers JSON when the query has format=json or the Accept
// header asks for application/json:
//
//	GET  ./              the top denied identifiers of every limit
//	GET  ./id?limit=L&id=I  the state of identifier I in limit L
//	GET  ./id?limit=L&digest=D  the same, by the identifier's digest
//	POST ./reset  (form: limit, id or digest)  forget what L counted for
//	                     the identifier, then redirect to its state
//	                     (JSON: {"reset": true})
//	POST ./unblock (form: target)  lift a manual block (operator.Operator)
//	POST ./clear  (form: limit, plan)  clear a quota override
//
// id64 and target64, the value in unpadded base64url, stand for id and
// target everywhere.
//
// The index and an identifier's state show the quota overrides and manual
// blocks the watched Limiters apply ([ratelimit.Stats].Operator),
// each override beside the quotas the live Limiters declare for its limit
// and plan ([operator.Declaration]);
// unblock and clear change them in Redis through each watched Limiter's
// [ratelimit.Inspector.Operator], for every replica (each within its
// refresh interval, redisstore.Options.OperatorRefresh).
//
// The Handler trusts whoever reaches it: mount it on a port only
// operators reach. It refuses cross-origin POSTs from browsers
// ([http.CrossOriginProtection]), so that a page elsewhere cannot make an
// operator's browser reset counts. Identifiers are the clients' input:
// they are escaped in HTML and JSON, and an identifier longer than
// [MaxID] bytes is refused in a request (look a longer one up by its
// digest). The page's forms carry identifiers base64url-encoded (id64=,
// in place of id=), so that form encoding, which turns a lone CR or LF
// into CRLF, cannot make a Reset act on another identifier.
package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"weak"

	"github.com/slidinglog/ratelimit"
	"github.com/slidinglog/ratelimit/internal/topk"
	"github.com/slidinglog/ratelimit/operator"
)

// MaxID is the longest identifier, in bytes, the Handler takes in a
// request.
const MaxID = 4096

// Options configure a Handler. The zero value is the defaults.
type Options struct {
	// Capacity is how many identifiers each limit's sketch counts per
	// minute; 100 if 0 or less. An identifier denied more than 1/Capacity
	// of a limit's denials over the window is always listed, and counts
	// are over the truth by at most that much, never under.
	//
	// Each limit's sketch holds at most Capacity*Minutes entries, each of
	// at most [operator.MaxKeyID]+1 bytes of identifier (a longer one is
	// kept as its digest and first bytes): [SketchBytes] is the bound,
	// about 380 KB per limit with the defaults, whatever the clients send.
	Capacity int
	// Minutes is the window the top identifiers are counted over, in
	// whole minutes; 10 if 0 or less.
	Minutes int
	// Top is how many identifiers the page and JSON list per limit; 20
	// if 0 or less. A request may ask for up to Capacity with n=.
	Top int
	// Timeout bounds each call to Redis the Handler makes (the state of
	// an identifier, a reset), on top of the Limiter's own timeout; 5
	// seconds if 0 or less.
	Timeout time.Duration
	// Now is the clock the sketch counts minutes by; time.Now if nil.
	Now func() time.Time
}

// SketchBytes is the most memory, in bytes, the sketch of one limit
// holds under o (defaults for zero fields), whatever the identifiers:
// Capacity*Minutes entries of at most 256 bytes of identifier and their
// bookkeeping. The sketches of a Handler hold at most one per limit name
// the observed Limiters deny by.
func SketchBytes(o Options) int {
	o = o.withDefaults()
	return topk.MaxBytes(o.Capacity, o.Minutes)
}

// Handler is an [http.Handler] that shows the denials of the Limiters it
// observes (see the package documentation). Create it with New. It is
// safe for concurrent use.
type Handler struct {
	opts     Options
	top      *topk.Set
	origin   *http.CrossOriginProtection
	mu       sync.Mutex
	limiters []weak.Pointer[ratelimit.Limiter]
}

// New returns a Handler with the given options (defaults for zero
// fields).
func New(o Options) *Handler {
	o = o.withDefaults()
	return &Handler{opts: o, top: topk.NewSet(o.Capacity, o.Minutes, time.Minute), origin: http.NewCrossOriginProtection()}
}

// withDefaults returns o with the defaults for its zero fields.
func (o Options) withDefaults() Options {
	if o.Capacity <= 0 {
		o.Capacity = 100
	}
	if o.Minutes <= 0 {
		o.Minutes = 10
	}
	if o.Top <= 0 {
		o.Top = 20
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Observer returns the hooks that feed the Handler, for
// [ratelimit.WithObserver]: Denial counts every denial, and Limiter gives
// the Handler the Limiter to read and reset identifiers with. Observing
// several Limiters, and one twice, is fine.
func (h *Handler) Observer() ratelimit.Observer {
	return ratelimit.Observer{Denial: h.observeDenial, Limiter: h.watch}
}

// observeDenial counts a denial of id by limit. It does not allocate for
// an identifier of at most [operator.MaxKeyID] bytes already counted this
// minute; a longer one costs its digest.
func (h *Handler) observeDenial(limit, id string) {
	h.top.Add(limit, sketchRef(id), h.opts.Now())
}

// The sketch holds an identifier of at most operator.MaxKeyID bytes as
// it is, and a longer one as a ref: its digest (operator.IDDigest), then
// its first shownLen bytes, so that a ref is longer than MaxKeyID and
// never taken for an identifier, and at most MaxKeyID+1 bytes.
var digestLen = len(operator.IDDigest(strings.Repeat("x", operator.MaxKeyID+1)))

var shownLen = operator.MaxKeyID + 1 - digestLen

// isDigest reports whether d has the form of operator.IDDigest's digests.
func isDigest(d string) bool {
	if len(d) != digestLen || d[0] != '#' {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(d[1:])
	return err == nil
}

// sketchRef returns what the sketch holds for id.
func sketchRef(id string) string {
	d := operator.IDDigest(id)
	if d == "" {
		return id
	}
	return d + id[:shownLen]
}

// entryOf returns the Entry of a sketch's entry.
func entryOf(e topk.Entry) Entry {
	out := Entry{ID: e.ID, Count: e.Count, Err: e.Err}
	if len(e.ID) > operator.MaxKeyID {
		out.Digest, out.ID = e.ID[:digestLen], e.ID[digestLen:]
	} else if !utf8.ValidString(e.ID) {
		out.ID64 = base64.RawURLEncoding.EncodeToString([]byte(e.ID))
	}
	return out
}

// watch gives the Handler a Limiter to read and reset identifiers with;
// [ratelimit.New] calls it, through Observer's Limiter hook, for a Limiter
// the Handler observes. Watching twice is watching once; nil is ignored.
// A Limiter is held weakly: once the application drops it, the Handler
// forgets it.
func (h *Handler) watch(l *ratelimit.Limiter) {
	if l == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.limiters {
		if w.Value() == l {
			return
		}
	}
	h.limiters = append(h.limiters, weak.Make(l))
}

// live returns the watched Limiters still held by the application.
func (h *Handler) live() []*ratelimit.Limiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*ratelimit.Limiter
	kept := h.limiters[:0]
	for _, w := range h.limiters {
		if l := w.Value(); l != nil {
			out = append(out, l)
			kept = append(kept, w)
		}
	}
	clear(h.limiters[len(kept):])
	h.limiters = kept
	return out
}

// limiterOf returns a watched Limiter with a limit called name.
func (h *Handler) limiterOf(name string) *ratelimit.Limiter {
	for _, l := range h.live() {
		if slices.Contains(l.Inspect().Limits(), name) {
			return l
		}
	}
	return nil
}

// names returns the limits to show: the watched Limiters' and those
// with denials, sorted.
func (h *Handler) names() []string {
	names := h.top.Names()
	for _, l := range h.live() {
		names = append(names, l.Inspect().Limits()...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Index is the JSON of the top denied identifiers.
type Index struct {
	// WindowSeconds is the window the denials are counted over.
	WindowSeconds int          `json:"window_seconds"`
	Limits        []LimitIndex `json:"limits"`
	// Overrides and Blocks are the quota overrides and manual blocks the
	// watched Limiters apply ([operator.Operator]), of every prefix.
	Overrides []Override `json:"overrides"`
	Blocks    []Block    `json:"blocks"`
	// Settled is what the watched Limiters' settles logged and took back
	// ([ratelimit.Stats].Debited and Credited), since they started.
	Settled Settled `json:"settled"`
}

// Settled counts units of cost settled: logged (Debited, real costs above
// the admitted ones) and taken back (Credited, below them, refunds
// included).
type Settled struct {
	Debited  uint64 `json:"debited"`
	Credited uint64 `json:"credited"`
}

// Override is a quota override in force ([operator.Override]).
type Override struct {
	Limit string `json:"limit"`
	Plan  string `json:"plan"` // "" for the limit's own quota
	Quota int    `json:"quota"`
	// Declared lists, ascending, the quotas the live Limiters of the
	// prefix declare for the limit and plan ([operator.Declaration]),
	// the one the override replaces: several while replicas of two
	// releases run, none if no live Limiter has the limit or the plan; -1
	// is unlimited.
	Declared []int `json:"declared"`
	// Expires is when it lapses, null for never.
	Expires *time.Time `json:"expires"`
}

// Block is a manual block in force ([operator.Block]).
type Block struct {
	Target  string    `json:"target"` // an identifier, or a CIDR
	Expires time.Time `json:"expires"`
}

// LimitIndex is one limit's top denied identifiers, most denied first.
type LimitIndex struct {
	Name string `json:"name"`
	// Denied counts the limit's denials in the window (exact).
	Denied uint64 `json:"denied"`
	// Top lists identifiers with an upper bound of their denials
	// (count) and how far over the truth it may be (err).
	Top []Entry `json:"top"`
}

// Entry is an identifier and its denials over the window, counted in
// bounded memory: Count is an upper bound, over the truth by at most Err.
// For an identifier longer than [operator.MaxKeyID] bytes, Digest is its
// digest ([operator.IDDigest]), which looks it up and resets it, and ID
// only its first bytes; Digest is empty for the others.
//
// JSON cannot carry an identifier that is not valid UTF-8 (the encoder
// puts U+FFFD in place of its invalid bytes): ID64 then holds the
// identifier in unpadded base64url, which id64= takes in place of id=.
type Entry struct {
	ID     string `json:"id"`
	ID64   string `json:"id64,omitempty"`
	Digest string `json:"digest,omitempty"`
	Count  uint64 `json:"count"`
	Err    uint64 `json:"err"`
}

// IDState is the JSON of one identifier's state in one limit.
type IDState struct {
	Limit string `json:"limit"`
	// ID is the identifier, "" when looked up by its digest; Digest is
	// its digest if it is longer than [operator.MaxKeyID] bytes (see
	// [Entry]), else "".
	ID            string    `json:"id"`
	Digest        string    `json:"digest,omitempty"`
	Plan          string    `json:"plan"`
	Quota         int       `json:"quota"`
	WindowSeconds float64   `json:"window_seconds"`
	Remaining     int       `json:"remaining"`
	Reset         time.Time `json:"reset"`
	// Denied reports whether a request of cost 1 would be denied now.
	Denied bool `json:"denied"`
	// InFlight reports an in-flight limit ([ratelimit.InFlight]): Quota
	// is its cap, WindowSeconds its lease, Holders the requests of the
	// identifier in flight now (across every replica), Remaining the
	// free slots; Reset is zero.
	InFlight bool `json:"inflight,omitempty"`
	Holders  int  `json:"holders,omitempty"`
	// DeniedRecently is an upper bound of the identifier's denials by
	// this limit in this process over the window.
	DeniedRecently uint64 `json:"denied_recently"`
	// Override is the override of the identifier's plan's quota in
	// force, Block the manual block that denies the identifier (the
	// identifier itself, or a CIDR that holds it); null if none.
	Override *Override `json:"override"`
	Block    *Block    `json:"block"`
}

// ServeHTTP serves the endpoints the package documentation lists.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	switch p := r.URL.Path; {
	case strings.HasSuffix(p, "/reset"):
		h.reset(w, r)
	case strings.HasSuffix(p, "/unblock"):
		h.unblock(w, r)
	case strings.HasSuffix(p, "/clear"):
		h.clear(w, r)
	case strings.HasSuffix(p, "/id"):
		h.id(w, r)
	case p == "" || strings.HasSuffix(p, "/"):
		h.index(w, r)
	default:
		h.fail(w, r, http.StatusNotFound, errors.New("no such page"))
	}
}

// wantsJSON reports whether r asks for JSON.
func wantsJSON(r *http.Request) bool {
	return r.URL.Query().Get("format") == "json" || strings.Contains(r.Header.Get("Accept"), "application/json")
}

func (h *Handler) index(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.fail(w, r, http.StatusMethodNotAllowed, errors.New("GET only"))
		return
	}
	n := h.opts.Top
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			h.fail(w, r, http.StatusBadRequest, errors.New("n must be a positive number"))
			return
		}
		n = min(v, h.opts.Capacity)
	}
	now := h.opts.Now()
	idx := Index{WindowSeconds: h.opts.Minutes * 60, Limits: []LimitIndex{}}
	idx.Overrides, idx.Blocks = h.operatorState()
	for _, l := range h.live() {
		st := l.Inspect().Stats()
		idx.Settled.Debited += st.Debited
		idx.Settled.Credited += st.Credited
	}
	for _, name := range h.names() {
		win := h.top.Window(name)
		top := []Entry{}
		for _, e := range win.Top(n, now) {
			top = append(top, entryOf(e))
		}
		idx.Limits = append(idx.Limits, LimitIndex{Name: name, Denied: win.Total(now), Top: top})
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, idx)
		return
	}
	render(w, http.StatusOK, page{Title: "Rate limits: top denied identifiers", Index: &idx, Minutes: h.opts.Minutes, Names: h.names()})
}

// query returns r's limit, and its identifier (id, or id64 decoded) or
// the digest of one, checked: an id of more than operator.MaxKeyID
// bytes comes with its digest.
func (h *Handler) query(r *http.Request) (limit, id, digest string, l *ratelimit.Limiter, status int, err error) {
	fail := func(status int, msg string) (string, string, string, *ratelimit.Limiter, int, error) {
		return "", "", "", nil, status, errors.New(msg)
	}
	limit, id, digest = r.FormValue("limit"), r.FormValue("id"), r.FormValue("digest")
	if s := r.FormValue("id64"); s != "" && id == "" {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(b) == 0 {
			return fail(http.StatusBadRequest, "id64 is not an identifier in base64url (unpadded)")
		}
		id = string(b)
	}
	switch {
	case limit == "" || id == "" && digest == "":
		return fail(http.StatusBadRequest, "limit, and id or digest, are required")
	case id != "" && digest != "":
		return fail(http.StatusBadRequest, "give id or digest, not both")
	case len(id) > MaxID || len(limit) > MaxID:
		return fail(http.StatusBadRequest, "id too long: look it up by its digest")
	case digest != "" && !isDigest(digest):
		return fail(http.StatusBadRequest, "digest is not an identifier's digest ('#' and 43 base64url characters)")
	}
	if id != "" {
		digest = operator.IDDigest(id)
	}
	if l = h.limiterOf(limit); l == nil {
		return fail(http.StatusNotFound, "no watched limiter has this limit")
	}
	return limit, id, digest, l, 0, nil
}

func (h *Handler) id(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.fail(w, r, http.StatusMethodNotAllowed, errors.New("GET only"))
		return
	}
	limit, id, digest, l, status, err := h.query(r)
	if err != nil {
		h.fail(w, r, status, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.Timeout)
	defer cancel()
	lr, err := l.Inspect().Status(ctx, limit, inspectorID(id, digest))
	if err != nil {
		h.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	st := IDState{Limit: limit, ID: id, Digest: digest, Plan: lr.Plan, Quota: lr.Quota, WindowSeconds: lr.Window.Seconds(),
		Remaining: lr.Remaining, Reset: lr.Reset, Denied: lr.Denied, InFlight: lr.InFlight}
	if lr.InFlight {
		st.Holders = max(lr.Quota-lr.Remaining, 0)
	}
	for _, te := range h.top.Window(limit).Top(0, h.opts.Now()) {
		if e := entryOf(te); e.Digest == digest && (digest != "" || e.ID == id) {
			st.DeniedRecently = e.Count
		}
	}
	overrides, blocks := h.operatorState()
	for i := range overrides {
		if o := &overrides[i]; o.Limit == limit && o.Plan == lr.Plan {
			st.Override = o
		}
	}
	addr, isAddr := idAddr(id)
	for i := range blocks {
		b := &blocks[i]
		if p, err := netip.ParsePrefix(b.Target); b.Target == id || err == nil && isAddr && p.Contains(addr) {
			st.Block = b
		}
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, st)
		return
	}
	render(w, http.StatusOK, page{Title: "Rate limits: one identifier", State: &st, Minutes: h.opts.Minutes, Names: h.names()})
}

func (h *Handler) reset(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.fail(w, r, http.StatusMethodNotAllowed, errors.New("POST only"))
		return
	}
	if err := h.origin.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, err)
		return
	}
	limit, id, digest, l, status, err := h.query(r)
	if err != nil {
		h.fail(w, r, status, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.Timeout)
	defer cancel()
	if err := l.Inspect().Reset(ctx, limit, inspectorID(id, digest)); err != nil {
		h.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]any{"reset": true, "limit": limit, "id": id, "digest": digest})
		return
	}
	http.Redirect(w, r, "id?"+urlValues(limit, id, digest), http.StatusSeeOther)
}

// inspectorID returns how [ratelimit.Inspector.Status] and Reset take
// the identifier id, or the one whose digest is digest when id is "": the
// digest, or id with one more '#' in front when it begins with '#', so
// that it is never read as a digest.
func inspectorID(id, digest string) string {
	switch {
	case id == "":
		return digest
	case id[0] == '#':
		return "#" + id
	}
	return id
}

// operatorState returns the overrides and blocks the watched Limiters
// apply, each once.
func (h *Handler) operatorState() ([]Override, []Block) {
	overrides, blocks := []Override{}, []Block{}
	seenQ, seenB := map[[2]string]bool{}, map[string]bool{}
	for _, l := range h.live() {
		st := l.Inspect().Stats().Operator
		for _, q := range st.Quotas {
			if k := [2]string{q.Limit, q.Plan}; !seenQ[k] {
				seenQ[k] = true
				o := Override{Limit: q.Limit, Plan: q.Plan, Quota: q.Quota, Declared: declaredQuotas(st.Declared, q.Limit, q.Plan)}
				if !q.Expires.IsZero() {
					exp := q.Expires
					o.Expires = &exp
				}
				overrides = append(overrides, o)
			}
		}
		for _, b := range st.Blocks {
			if !seenB[b.Target] {
				seenB[b.Target] = true
				blocks = append(blocks, Block{Target: b.Target, Expires: b.Expires})
			}
		}
	}
	return overrides, blocks
}

// declaredQuotas returns the distinct quotas decls declare for limit and
// plan, ascending.
func declaredQuotas(decls []operator.Declaration, limit, plan string) []int {
	out := []int{}
	for _, d := range decls {
		if d.Limit != limit {
			continue
		}
		q, ok := d.Quota, plan == ""
		if !ok {
			q, ok = d.Plans[plan]
		}
		if ok && !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out
}

// idAddr returns the address an identifier names, if it is an IP address
// or a network (ClientIP's "2001:db8::/64").
func idAddr(id string) (netip.Addr, bool) {
	if p, err := netip.ParsePrefix(id); err == nil {
		return p.Masked().Addr(), true
	}
	a, err := netip.ParseAddr(id)
	return a.Unmap(), err == nil
}

// unblock lifts the block of the form's target, for every replica
// ([operator.Operator.Unblock], through each watched Limiter's prefix).
func (h *Handler) unblock(w http.ResponseWriter, r *http.Request) {
	h.operate(w, r, "target", func(ctx context.Context, op *operator.Operator, target string) (bool, error) {
		return op.Unblock(ctx, target)
	})
}

// clear removes the override of the form's limit and plan
// ([operator.Operator.ClearQuota]).
func (h *Handler) clear(w http.ResponseWriter, r *http.Request) {
	plan := r.FormValue("plan")
	h.operate(w, r, "limit", func(ctx context.Context, op *operator.Operator, limit string) (bool, error) {
		return op.ClearQuota(ctx, limit, plan)
	})
}

// operate runs a change of the operator state, the form's field what its
// argument, through the Operator of every watched Limiter (each applies it
// at once; the other replicas within their refresh interval), and answers
// as reset does, redirecting to the index.
func (h *Handler) operate(w http.ResponseWriter, r *http.Request, field string, change func(context.Context, *operator.Operator, string) (bool, error)) {
	if r.Method != http.MethodPost {
		h.fail(w, r, http.StatusMethodNotAllowed, errors.New("POST only"))
		return
	}
	if err := h.origin.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, err)
		return
	}
	arg := r.FormValue(field)
	if s := r.FormValue(field + "64"); s != "" && arg == "" { // the page's forms: see the package doc
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, errors.New(field+"64 is not base64url (unpadded)"))
			return
		}
		arg = string(b)
	}
	if arg == "" || len(arg) > MaxID {
		h.fail(w, r, http.StatusBadRequest, errors.New(field+" is required, of at most MaxID bytes"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.Timeout)
	defer cancel()
	done := false
	for _, l := range h.live() {
		ok, err := change(ctx, l.Inspect().Operator(), arg)
		if err != nil {
			h.fail(w, r, http.StatusServiceUnavailable, err)
			return
		}
		done = done || ok
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]any{"done": done, field: arg})
		return
	}
	http.Redirect(w, r, "./", http.StatusSeeOther)
}

// fail answers an error, as JSON or as the page.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if wantsJSON(r) {
		writeJSON(w, status, map[string]string{"error": err.Error()})
		return
	}
	render(w, status, page{Title: "Rate limits: " + http.StatusText(status), Error: err.Error(), Minutes: h.opts.Minutes, Names: h.names()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w) // escapes <, > and & in the clients' identifiers
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
