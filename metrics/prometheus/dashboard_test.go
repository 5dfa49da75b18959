package ratelimitprom_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/slidinglog/ratelimit"
	ratelimitprom "github.com/slidinglog/ratelimit/metrics/prometheus"
	"github.com/slidinglog/ratelimit/redisstore"
	"github.com/slidinglog/ratelimit/redistest"
)

// dashboardFile is the Grafana dashboard shipped with the module.
const dashboardFile = "grafana/ratelimit.json"

// targetLabels are the labels Prometheus adds to every series it
// scrapes: a dashboard may group by them although no exporter exports
// them.
var targetLabels = []string{"job", "instance"}

// exported is what an exporter exports: each series name (a histogram's
// _bucket, _sum and _count each) with its label names and the values
// seen for each.
type exported map[string]map[string]map[string]bool

// gatherAll drives a Limiter on miniredis, observed by the Metrics,
// through every outcome the exporter knows (allowed, denied, a denial
// from the deny cache, shadow_denied, skipped, no_key, error, an open
// breaker, warnings) and returns what the registry then exports.
func gatherAll(t *testing.T) exported {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	m := ratelimitprom.New()
	lim, err := ratelimit.New(nil, []ratelimit.Limit{
		ratelimit.Per(time.Minute, 2, ratelimit.Header("X-Client")).Named("api"),
		ratelimit.Per(time.Minute, 1, ratelimit.Header("X-Client")).Shadowed().Named("trial"),
	}, ratelimit.WithObserver(m.Observer()), ratelimit.WithClock(func() time.Time { return now }),
		ratelimit.WithStore(redisStore(t, rdb, redisstore.Options{DenyCache: time.Minute, BreakerFailures: 1, BreakerCoolDown: time.Hour})),
		ratelimit.WithHandlers(ratelimit.Handlers{MissingKey: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusUnauthorized) }}), // said: no warning logged
		ratelimit.WithTimeout(redistest.DecisionTimeout),
		ratelimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	h := lim.Handler(http.NotFoundHandler())
	send := func(path, client string) int {
		r := httptest.NewRequest("GET", path, nil)
		if client != "" {
			r.Header.Set("X-Client", client)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for range 4 { // allowed, allowed (trial would deny), denied, denied from the deny cache
		send("/", "c")
	}
	send("/healthz", "c") // skipped
	send("/", "")         // no_key
	m.Observer().Warning(ratelimit.WarningUntrustedProxy)
	mr.SetError("LOADING Redis is loading the dataset in memory")
	send("/", "d") // error, and the breaker opens
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ex := exported{}
	add := func(name string, labels map[string]string) {
		if ex[name] == nil {
			ex[name] = map[string]map[string]bool{}
		}
		for k, v := range labels {
			if ex[name][k] == nil {
				ex[name][k] = map[string]bool{}
			}
			ex[name][k][v] = true
		}
	}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range mt.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if hg := mt.GetHistogram(); hg != nil {
				add(f.GetName()+"_sum", labels)
				add(f.GetName()+"_count", labels)
				for _, b := range hg.GetBucket() {
					withLe := map[string]string{"le": fmt.Sprint(b.GetUpperBound())}
					for k, v := range labels {
						withLe[k] = v
					}
					add(f.GetName()+"_bucket", withLe)
				}
				continue
			}
			add(f.GetName(), labels)
		}
	}
	// The drive reached every outcome: else the comparison below proves less.
	for _, o := range []string{"allowed", "denied", "shadow_denied", "skipped", "no_key", "error"} {
		if !ex["ratelimit_decisions_total"]["outcome"][o] {
			t.Errorf("the drive never reached outcome %q", o)
		}
	}
	for _, name := range []string{"ratelimit_deny_cache_hits_total", "ratelimit_breaker_open", "ratelimit_unreverted_units_total", "ratelimit_warnings_total", "ratelimit_decision_duration_seconds_bucket"} {
		if ex[name] == nil {
			t.Errorf("the drive left no %s", name)
		}
	}
	return ex
}

// TestDenyCacheHits: a denial answered from the deny cache is counted as
// a denial and as a deny-cache hit of the limit that denied.
func TestDenyCacheHits(t *testing.T) {
	ex := gatherAll(t)
	if !ex["ratelimit_deny_cache_hits_total"]["limit"]["api"] || len(ex["ratelimit_deny_cache_hits_total"]["limit"]) != 1 {
		t.Errorf("deny-cache hits: %v, want limit api only", ex["ratelimit_deny_cache_hits_total"])
	}
}

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []struct {
		ID         int             `json:"id"`
		Type       string          `json:"type"`
		Title      string          `json:"title"`
		Datasource json.RawMessage `json:"datasource"`
		GridPos    struct {
			X, Y, W, H int
		} `json:"gridPos"`
		Targets []struct {
			RefID      string          `json:"refId"`
			Expr       string          `json:"expr"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

// TestDashboard checks that the dashboard is one Grafana loads (the
// fields it requires, unique panel ids, panels that do not overlap, a
// data-source variable every query uses) and that every PromQL query in
// it names only series, labels and label values the exporter really
// exports.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || len(d.UID) > 40 || d.SchemaVersion < 30 || len(d.Panels) == 0 {
		t.Errorf("title %q, uid %q, schemaVersion %d, %d panels", d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("no data-source variable: %v", vars)
	}
	ex := gatherAll(t)
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var queries int
	const ds = `{"type":"prometheus","uid":"${datasource}"}`
	for _, p := range d.Panels {
		if p.ID <= 0 || ids[p.ID] {
			t.Errorf("panel %q: id %d is not a unique positive number", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "" || p.Title == "" || p.GridPos.W < 1 || p.GridPos.H < 1 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %d %q: type %q, gridPos %+v", p.ID, p.Title, p.Type, p.GridPos)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Fatalf("panel %q overlaps %q at %d,%d", p.Title, other, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if compactJSON(t, p.Datasource) != ds {
			t.Errorf("panel %q: datasource %s, want %s", p.Title, p.Datasource, ds)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			queries++
			if q.RefID == "" || refs[q.RefID] {
				t.Errorf("panel %q: refId %q missing or repeated", p.Title, q.RefID)
			}
			refs[q.RefID] = true
			if compactJSON(t, q.Datasource) != ds {
				t.Errorf("panel %q: query datasource %s, want %s", p.Title, q.Datasource, ds)
			}
			if err := checkPromQL(q.Expr, ex); err != nil {
				t.Errorf("panel %q: %v\n\t%s", p.Title, err, q.Expr)
			}
		}
	}
	// Variables that query Prometheus: label_values(metric, label).
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		_ = json.Unmarshal(v.Query, &q)
		m := regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`).FindStringSubmatch(q.Query)
		if m == nil || ex[m[1]] == nil || ex[m[1]][m[2]] == nil {
			t.Errorf("variable %s: query %q names no exported series and label", v.Name, q.Query)
		}
		if compactJSON(t, v.Datasource) != ds {
			t.Errorf("variable %s: datasource %s", v.Name, v.Datasource)
		}
	}
	t.Logf("%d panels, %d queries checked against %d exported series", len(d.Panels), queries, len(ex))
}

// TestCheckPromQL: the checker refuses what a wrong dashboard would say,
// so that TestDashboard can fail.
func TestCheckPromQL(t *testing.T) {
	ex := gatherAll(t)
	for _, c := range []struct{ expr, err string }{
		{`sum by (limit) (rate(ratelimit_decisions_total{outcome="denied", limit=~"$limit"}[$__rate_interval]))`, ""},
		{`histogram_quantile(0.99, sum by (le) (rate(ratelimit_decision_duration_seconds_bucket[5m])))`, ""},
		{`max by (instance) (ratelimit_breaker_open) / clamp_min(1e-9, 2)`, ""},
		{`rate(ratelimit_denied_total[5m])`, "not exported"},
		{`sum by (route) (rate(ratelimit_decisions_total[5m]))`, "label route"},
		{`ratelimit_decisions_total{outcome="refused"}`, "value"},
		{`ratelimit_decisions_total{outcome=~"allowed|refused"}`, "value"},
		{`ratelimit_decision_duration_seconds_bucket{limit="x"}`, "label limit"},
		{`rate(ratelimit_decisions_total[5m]`, "unbalanced"},
		{`rat(ratelimit_decisions_total[5m])`, "unknown function"},
		{`sum(rate(ratelimit_decisions_total{outcome="denied"}[5m])) / sum(rate(ratelimit_decisions_totl[5m]))`, "not exported"},
		{`sum by (le) (ratelimit_breaker_open)`, "label le"},
	} {
		err := checkPromQL(c.expr, ex)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want %q", c.expr, err, c.err)
		}
	}
}

func compactJSON(t *testing.T, raw json.RawMessage) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return strings.ReplaceAll(string(b), `\u0026`, "&")
}

// promFunctions are PromQL's functions and aggregation operators.
var promFunctions = strings.Fields(`abs absent absent_over_time avg_over_time ceil changes clamp clamp_max
clamp_min count_over_time day_of_month day_of_week days_in_month delta deriv exp floor histogram_quantile
histogram_count histogram_sum holt_winters idelta increase irate label_join label_replace last_over_time ln log10
log2 max_over_time min_over_time minute month predict_linear quantile_over_time rate resets round scalar sgn sort
sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector year
sum min max avg group stddev stdvar count count_values bottomk topk quantile`)

var promKeywords = strings.Fields(`by without on ignoring group_left group_right and or unless bool offset atan2 inf nan`)

// grafanaVars stand for Grafana's variables in a query: durations, and
// a regular expression for a variable in a label value.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

var tokenRE = regexp.MustCompile(`\s*(?:("(?:[^"\\]|\\.)*")|([a-zA-Z_:][a-zA-Z0-9_:]*)|([0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?[smhdwy]?)|(=~|!~|==|!=|<=|>=|[-+*/%^<>=(){}\[\],]))`)

// checkPromQL parses the query as far as needed to find every series it
// selects, every label it matches on or groups by and every label value
// it matches, and checks them against ex. It knows PromQL's functions and
// keywords; anything else outside braces and brackets is a series name.
func checkPromQL(expr string, ex exported) error {
	s := grafanaVars.Replace(expr)
	var toks []string
	for rest := s; strings.TrimSpace(rest) != ""; {
		m := tokenRE.FindStringSubmatchIndex(rest)
		if m == nil || m[0] != 0 {
			return fmt.Errorf("cannot read %q", rest)
		}
		toks = append(toks, strings.TrimSpace(rest[m[0]:m[1]]))
		rest = rest[m[1]:]
	}
	depth := map[string]int{}
	for _, tk := range toks {
		switch tk {
		case "(", "{", "[":
			depth[tk]++
		case ")":
			depth["("]--
		case "}":
			depth["{"]--
		case "]":
			depth["["]--
		}
		if depth["("] < 0 || depth["{"] < 0 || depth["["] < 0 {
			return errors.New("unbalanced brackets")
		}
	}
	if depth["("] != 0 || depth["{"] != 0 || depth["["] != 0 {
		return errors.New("unbalanced brackets")
	}
	isIdent := func(tk string) bool { return regexp.MustCompile(`^[a-zA-Z_:]`).MatchString(tk) }
	var series, grouping []string
	type matcher struct{ series, label, op, value string }
	var matchers []matcher
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		next := ""
		if i+1 < len(toks) {
			next = toks[i+1]
		}
		switch {
		case tk == "[": // a range or subquery: durations only
			for toks[i] != "]" {
				i++
			}
		case tk == "{": // matchers of the series before it
			owner := ""
			if i > 0 && isIdent(toks[i-1]) {
				owner = toks[i-1]
			}
			for i++; toks[i] != "}"; i++ {
				if toks[i] == "," {
					continue
				}
				if i+2 >= len(toks) || !isIdent(toks[i]) || !strings.HasPrefix(toks[i+2], `"`) {
					return fmt.Errorf("cannot read the matchers at %q", toks[i])
				}
				matchers = append(matchers, matcher{owner, toks[i], toks[i+1], strings.Trim(toks[i+2], `"`)})
				i += 2
			}
		case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, tk):
			if next == "(" {
				for i += 2; toks[i] != ")"; i++ {
					if toks[i] != "," {
						grouping = append(grouping, toks[i])
					}
				}
			}
		case slices.Contains(promKeywords, tk):
		case isIdent(tk) && next == "(":
			if !slices.Contains(promFunctions, tk) {
				return fmt.Errorf("unknown function %s", tk)
			}
		case isIdent(tk) && slices.Contains(promFunctions, tk) && (next == "by" || next == "without"):
		case isIdent(tk):
			series = append(series, tk)
		}
	}
	if len(series) == 0 {
		return errors.New("selects no series")
	}
	labelsOf := map[string]bool{}
	for _, name := range series {
		if ex[name] == nil {
			return fmt.Errorf("series %s is not exported", name)
		}
		for l := range ex[name] {
			labelsOf[l] = true
		}
	}
	for _, m := range matchers {
		labels := ex[m.series]
		if labels[m.label] == nil {
			return fmt.Errorf("label %s is not one of %s's", m.label, m.series)
		}
		values := []string{m.value}
		switch {
		case strings.Contains(m.value, "$") || m.value == ".*" || m.op == "!=" || m.op == "!~":
			continue // a variable, or a negation: any value may do
		case m.op == "=~":
			if !regexp.MustCompile(`^[a-z_|]+$`).MatchString(m.value) {
				continue
			}
			values = strings.Split(m.value, "|")
		}
		for _, v := range values {
			if !labels[m.label][v] {
				return fmt.Errorf("%s never has the value %s=%q", m.series, m.label, v)
			}
		}
	}
	for _, l := range grouping {
		if !labelsOf[l] && !slices.Contains(targetLabels, l) {
			return fmt.Errorf("label %s is on none of %v", l, series)
		}
	}
	return nil
}
