package ratelimit

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// statusWriter remembers the status of the response it writes, for
// WithRefund. Handlers get it through wrap, which keeps the optional
// interfaces of the writer it wraps.
type statusWriter struct {
	http.ResponseWriter
	code int // the final status, once known; 0 before
}

// wrap returns w in the type below whose optional interfaces (http.Flusher,
// http.Hijacker, io.ReaderFrom, http.Pusher) are exactly those of
// w.ResponseWriter, so that streaming, upgrades and sendfile behave as
// without the wrapper and a handler that looks for an interface the writer
// lacks still finds none. Each type is a single pointer to w, so the
// interface value costs no allocation.
func (w *statusWriter) wrap() http.ResponseWriter {
	var has int
	if _, ok := w.ResponseWriter.(http.Flusher); ok {
		has |= hasFlusher
	}
	if _, ok := w.ResponseWriter.(http.Hijacker); ok {
		has |= hasHijacker
	}
	if _, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		has |= hasReaderFrom
	}
	if _, ok := w.ResponseWriter.(http.Pusher); ok {
		has |= hasPusher
	}
	b := rw{w}
	switch has {
	case 0:
		return b
	case hasFlusher:
		return rwF{b}
	case hasHijacker:
		return rwH{b}
	case hasFlusher | hasHijacker:
		return rwFH{rwF{b}}
	case hasReaderFrom:
		return rwR{b}
	case hasFlusher | hasReaderFrom:
		return rwFR{rwF{b}}
	case hasHijacker | hasReaderFrom:
		return rwHR{rwH{b}}
	case hasFlusher | hasHijacker | hasReaderFrom: // net/http's HTTP/1 writer
		return rwFHR{rwFH{rwF{b}}}
	case hasPusher:
		return rwP{b}
	case hasFlusher | hasPusher: // net/http's HTTP/2 writer
		return rwFP{rwF{b}}
	case hasHijacker | hasPusher:
		return rwHP{rwH{b}}
	case hasFlusher | hasHijacker | hasPusher:
		return rwFHP{rwFH{rwF{b}}}
	case hasReaderFrom | hasPusher:
		return rwRP{rwR{b}}
	case hasFlusher | hasReaderFrom | hasPusher:
		return rwFRP{rwFR{rwF{b}}}
	case hasHijacker | hasReaderFrom | hasPusher:
		return rwHRP{rwHR{rwH{b}}}
	default:
		return rwFHRP{rwFHR{rwFH{rwF{b}}}}
	}
}

const (
	hasFlusher = 1 << iota
	hasHijacker
	hasReaderFrom
	hasPusher
)

// WriteHeader records the first final status: an informational 1xx other
// than 101 is not the response's status.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write, like a flush or ReadFrom, implies 200 if no status was written.
func (w *statusWriter) Write(b []byte) (int, error) {
	w.implyOK()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) implyOK() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
}

// status is the status refund sees: 200 if the handler wrote nothing, 101 if
// it hijacked the connection before writing a status.
func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// flushError flushes w, keeping the error of a writer that reports one (as
// http.ResponseController does).
func (w *statusWriter) flushError() error {
	w.implyOK()
	if f, ok := w.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	w.ResponseWriter.(http.Flusher).Flush()
	return nil
}

func (w *statusWriter) hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, buf, err := w.ResponseWriter.(http.Hijacker).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return c, buf, err
}

func (w *statusWriter) readFrom(src io.Reader) (int64, error) {
	w.implyOK()
	return w.ResponseWriter.(io.ReaderFrom).ReadFrom(src)
}

func (w *statusWriter) push(target string, opts *http.PushOptions) error {
	return w.ResponseWriter.(http.Pusher).Push(target, opts)
}

// The 16 wrappers wrap returns, named by the interfaces they add to
// http.ResponseWriter (Flusher, Hijacker, ReaderFrom, Pusher). Each embeds
// the wrapper with one interface fewer and adds the method of its last
// letter, so every method is written once per type that adds it; all are
// one pointer to the statusWriter.
type (
	rw     struct{ *statusWriter }
	rwF    struct{ rw }
	rwH    struct{ rw }
	rwFH   struct{ rwF }
	rwR    struct{ rw }
	rwFR   struct{ rwF }
	rwHR   struct{ rwH }
	rwFHR  struct{ rwFH }
	rwP    struct{ rw }
	rwFP   struct{ rwF }
	rwHP   struct{ rwH }
	rwFHP  struct{ rwFH }
	rwRP   struct{ rwR }
	rwFRP  struct{ rwFR }
	rwHRP  struct{ rwHR }
	rwFHRP struct{ rwFHR }
)

// Flusher: a flush before WriteHeader sends a 200. FlushError keeps the
// error for http.ResponseController.
func (w rwF) Flush()            { _ = w.flushError() }
func (w rwF) FlushError() error { return w.flushError() }

// Hijacker: a hijacked connection counts as 101 Switching Protocols.
func (w rwH) Hijack() (net.Conn, *bufio.ReadWriter, error)  { return w.hijack() }
func (w rwFH) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.hijack() }

// ReaderFrom: sends a 200 if no status was written.
func (w rwR) ReadFrom(src io.Reader) (int64, error)   { return w.readFrom(src) }
func (w rwFR) ReadFrom(src io.Reader) (int64, error)  { return w.readFrom(src) }
func (w rwHR) ReadFrom(src io.Reader) (int64, error)  { return w.readFrom(src) }
func (w rwFHR) ReadFrom(src io.Reader) (int64, error) { return w.readFrom(src) }

// Pusher.
func (w rwP) Push(target string, opts *http.PushOptions) error    { return w.push(target, opts) }
func (w rwFP) Push(target string, opts *http.PushOptions) error   { return w.push(target, opts) }
func (w rwHP) Push(target string, opts *http.PushOptions) error   { return w.push(target, opts) }
func (w rwFHP) Push(target string, opts *http.PushOptions) error  { return w.push(target, opts) }
func (w rwRP) Push(target string, opts *http.PushOptions) error   { return w.push(target, opts) }
func (w rwFRP) Push(target string, opts *http.PushOptions) error  { return w.push(target, opts) }
func (w rwHRP) Push(target string, opts *http.PushOptions) error  { return w.push(target, opts) }
func (w rwFHRP) Push(target string, opts *http.PushOptions) error { return w.push(target, opts) }

// WithRefund makes the middleware take back requests whose response status
// refund reports true, as if they had never been admitted (a settle at 0,
// [Limiter.Settle]), for example failures that should not cost the client:
//
//	ratelimit.WithRefund(func(status int) bool { return status >= 500 })
//
// refund sees the response's final status (200 if the handler wrote a body
// or nothing; 101 for a hijacked connection). [Limiter.Handler] and the
// router adapters refund ([Pass.Done]); gRPC handlers can call
// [Settle] at 0. WithRefund(f) is [WithSettle] with a function that
// returns 0 where f reports true and the admitted cost otherwise: it turns
// settlement on as that does, and of WithRefund and WithSettle the last
// one given wins, as for every other option. It costs a wrapped
// ResponseWriter and the request's context per request, and a Redis call
// per refund. Default: no refunds. A nil refund is an error from [New].
// See docs/limits.md (refunds).
func WithRefund(refund func(status int) bool) Option {
	if refund == nil {
		return func(c *config) { c.nilArg("WithRefund", true, "leave the option out") }
	}
	return WithSettle(func(status int, _ http.Header, cost int) int {
		if refund(status) {
			return 0
		}
		return cost
	})
}
