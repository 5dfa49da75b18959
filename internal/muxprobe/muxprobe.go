// Package muxprobe asks an http.ServeMux which of its routes serve a route
// template, and which are near it: a ServeMux cannot list its routes, so
// the route table's check (package route) and New's check of the mux of
// WithRoutesFrom (package ratelimit) ask it about request paths.
package muxprobe

import (
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
)

// Rules are the route-template rules of package route the probe uses.
type Rules struct {
	// Split splits a template into its method ("" for none) and its path
	// in the canonical form.
	Split func(template string) (method, path string)
	// Valid reports why a path is one no router writes; nil if valid.
	Valid func(path string) error
}

// Methods are the methods a route template may name.
var Methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace}

// redirectType is the type of the handler http.RedirectHandler returns,
// which a ServeMux answers its own redirects with.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusMovedPermanently))

// probeValue fills a parameter in the paths the probe asks a mux about: a
// value no literal route is likely to have.
const probeValue = "ratelimit-probe-7f3a"

// instantiate returns a request path that the canonical template path
// matches: each parameter filled with probeValue, a wildcard with two
// segments of it, "{$}" with nothing.
func instantiate(path string) string { return instantiateN(path, 2) }

// wildcardSegments are the numbers of segments Serves fills a wildcard
// with, in turn: a route more specific than the wildcard's may take the
// requests of one number of segments (a "/{a}/{b}/{c}" route those of
// "/{a}/{...}" with two), never those of all.
var wildcardSegments = []int{2, 1, 3, 4, 0}

// instantiateN is instantiate with n segments for a wildcard.
func instantiateN(path string, n int) string {
	var b strings.Builder
	for i := 0; i < len(path); {
		if path[i] != '{' {
			b.WriteByte(path[i])
			i++
			continue
		}
		j := strings.IndexByte(path[i:], '}')
		if j < 0 {
			b.WriteString(path[i:])
			break
		}
		switch path[i+1 : i+j] {
		case "$":
		case "...":
			for k := range n {
				if k > 0 {
					b.WriteByte('/')
				}
				b.WriteString(probeValue)
			}
		default:
			b.WriteString(probeValue)
		}
		i += j + 1
	}
	return b.String()
}

// pattern returns the pattern of the route of mux that a request of
// method to the request path reaches, "" if none (or a redirect, when
// follow is false; when it is true, the route the redirect leads to).
func pattern(mux *http.ServeMux, method, path string, follow bool) string {
	for range 2 {
		r := &http.Request{Method: method, URL: &url.URL{Path: path}, Header: http.Header{}}
		h, pattern := mux.Handler(r)
		// The mux's own trailing-slash redirect gives the path it
		// redirects to; a route of the app's that redirects (an
		// http.RedirectHandler) its pattern.
		if reflect.TypeOf(h) != redirectType || pattern != path+"/" {
			return pattern
		}
		if !follow || pattern == "" {
			return ""
		}
		path = pattern // the redirect's path
	}
	return ""
}

// Serves reports whether a route of mux serves the requests of the entry
// of method ("" for every method) and canonical path, so that the entry
// decides them.
func (ru Rules) Serves(mux *http.ServeMux, method, path string) bool {
	methods := []string{method}
	if method == "" {
		methods = Methods
	}
	counts := wildcardSegments[:1]
	if strings.Contains(path, "{...}") {
		counts = wildcardSegments
	}
	for _, n := range counts {
		probe := instantiateN(path, n)
		for _, m := range methods {
			pm, pp := ru.Split(pattern(mux, m, probe, false))
			if pp == path && (pm == "" || method == "" || pm == method || method == http.MethodHead && pm == http.MethodGet) {
				return true
			}
		}
	}
	return false
}

// editMethods are the methods the probe asks a mux about the edits of an
// entry's path with: the entry's; GET and POST, which most routes are,
// for an entry without one (its own path is asked for under every method),
// to bound the work.
func editMethods(method string) []string {
	if method == "" {
		return []string{http.MethodGet, http.MethodPost}
	}
	return []string{method}
}

// probeAlphabet is what the probe inserts into and substitutes in an
// entry's path when it looks for the routes near it.
const probeAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_./"

// Near returns the patterns of the routes of mux near the entry of method
// and canonical path: those its path reaches under every method, and
// those that the paths one edit away, with a trailing slash added or
// removed, with a segment left out or a parameter's segment added, reach
// under the entry's method (GET and POST for an entry without one). Each
// pattern is given once.
func (ru Rules) Near(mux *http.ServeMux, method, path string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(pattern string) {
		if pattern == "" || seen[pattern] {
			return
		}
		seen[pattern] = true
		out = append(out, pattern)
	}
	probe := instantiate(path)
	for _, m := range Methods {
		add(pattern(mux, m, probe, true))
	}
	// A segment left out of the entry: its path with a parameter's value
	// inserted, which reaches a route with a parameter there.
	for i := 1; i <= len(path); i++ {
		if i == len(path) || path[i] == '/' {
			for _, m := range editMethods(method) {
				add(pattern(mux, m, instantiate(path[:i]+"/{p}"+path[i:]), true))
			}
		}
	}
	variants := map[string]bool{}
	if strings.HasSuffix(path, "/") {
		variants[strings.TrimSuffix(path, "/")] = true
	} else {
		variants[path+"/"] = true
	}
	segs := strings.Split(path[1:], "/")
	for i := range segs {
		variants["/"+strings.Join(slices.Delete(slices.Clone(segs), i, i+1), "/")] = true
	}
	for i := 0; i <= len(path); i++ {
		if i > 0 && i < len(path) {
			variants[path[:i]+path[i+1:]] = true
		}
		for _, c := range probeAlphabet {
			variants[path[:i]+string(c)+path[i:]] = true
			if i > 0 && i < len(path) {
				variants[path[:i]+string(c)+path[i+1:]] = true
			}
		}
	}
	for v := range variants {
		if v == "" || ru.Valid(v) != nil {
			continue
		}
		_, v = ru.Split(v)
		for _, m := range editMethods(method) {
			p := pattern(mux, m, instantiate(v), false)
			if _, pp := ru.Split(p); pp == v {
				add(p)
			}
		}
	}
	return out
}
